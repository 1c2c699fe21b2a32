// The one place spdlog is set up: a single format for every program, with the role
// ("launcher", "worker 1", "chief") in every line. Other files just call spdlog::info() etc.
#pragma once

#include <string>

namespace dtrain::common {

/// Sends the default logger to stderr with dtrain's format. level is one of
/// trace|debug|info|warn|error|off ("" = DTRAIN_LOG_LEVEL or info); an unknown level is a
/// ConfigError. Colour only when stderr is a terminal and NO_COLOR is unset. Not thread-safe
/// against concurrent logging; call once at the start of main().
void setup_logging(const std::string& role, const std::string& level = "");

/// Role text for a TF_CONFIG task: "worker 1", "chief", "evaluator".
std::string role_name(const std::string& task_type, int task_index);

}  // namespace dtrain::common
