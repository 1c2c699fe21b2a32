// The one place spdlog is set up: a single format for every program, with the role
// ("launcher", "worker 1", "chief") in every line, except a worker's under the launcher, which
// adds the role itself. Other files just call spdlog::info() etc.
#pragma once

#include <string>

namespace dtrain::common {

/// Sends the default logger to stderr with dtrain's format. level is one of
/// trace|debug|info|warn|error|off ("" = DTRAIN_LOG_LEVEL or info); an unknown level is a
/// ConfigError. Colour only when stderr is a terminal and NO_COLOR is unset. Not thread-safe
/// against concurrent logging; call once at the start of main().
void setup_logging(const std::string& role, const std::string& level = "");

/// spdlog's pattern for role: "%Y-%m-%d %H:%M:%S.%e %^%L%$ [role] %v", without "[role] " when
/// role is empty.
std::string log_pattern(const std::string& role);

/// The role a worker puts in its own lines: role_name(), or "" when it runs under the launcher
/// (supervised: DTRAIN_CONTROL or DTRAIN_RUN_DIR set), whose console prefixes each line with the
/// worker already and whose log files are per worker.
std::string worker_log_role(const std::string& task_type, int task_index, bool supervised);

/// Role text for a TF_CONFIG task: "worker 1", "chief", "evaluator".
std::string role_name(const std::string& task_type, int task_index);

}  // namespace dtrain::common
