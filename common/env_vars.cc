// Reading the variables of env_vars.h.
#include "common/env_vars.h"

#include <cstdlib>

namespace dtrain::common {

std::optional<std::string> get_env(const EnvVar& var) {
  const char* value = std::getenv(var.name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string get_env_or_default(const EnvVar& var) {
  return get_env(var).value_or(var.default_value);
}

bool is_reserved_env_name(std::string_view name) {
  for (const EnvVar* var :
       {&kEnvTfConfig, &kEnvJob, &kEnvRunDir, &kEnvAttempt, &kEnvGeneration, &kEnvRecovery,
        &kEnvMembers, &kEnvSpare, &kEnvProgressFile, &kEnvToken, &kEnvControl, &kEnvConfigText}) {
    if (name == var->name) return true;
  }
  return false;
}

}  // namespace dtrain::common
