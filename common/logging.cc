// spdlog set-up. Format: "2026-11-21 19:40:01.123 I [worker 1] message" (no "[worker 1] " in a
// worker under the launcher).
#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "common/env_vars.h"
#include "common/errors.h"

namespace dtrain::common {

void setup_logging(const std::string& role, const std::string& level) {
  std::string name = level.empty() ? get_env_or_default(kEnvLogLevel) : level;
  spdlog::level::level_enum parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off") {
    throw ConfigError(
        fmt::format("log level \"{}\": expected trace, debug, info, warn, error or off", name));
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  bool colour = ::isatty(STDERR_FILENO) == 1 && !get_env(kEnvNoColor).has_value();
  sink->set_color_mode(colour ? spdlog::color_mode::always : spdlog::color_mode::never);
  auto logger = std::make_shared<spdlog::logger>("dtrain", sink);
  logger->set_pattern(log_pattern(role));
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

std::string log_pattern(const std::string& role) {
  if (role.empty()) return "%Y-%m-%d %H:%M:%S.%e %^%L%$ %v";
  return fmt::format("%Y-%m-%d %H:%M:%S.%e %^%L%$ [{}] %v", role);
}

std::string worker_log_role(const std::string& task_type, int task_index, bool supervised) {
  return supervised ? "" : role_name(task_type, task_index);
}

std::string role_name(const std::string& task_type, int task_index) {
  if (task_type == "chief" || task_type == "evaluator") return task_type;
  return fmt::format("{} {}", task_type, task_index);
}

}  // namespace dtrain::common
