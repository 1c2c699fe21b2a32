// The one list of environment variables dtrain reads or sets, with their defaults.
// Who sets what is in DESIGN.md ("What a worker is given"); this file only names them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dtrain::common {

struct EnvVar {
  const char* name;
  const char* default_value;  ///< "" when there is no default
  const char* meaning;
};

inline constexpr EnvVar kEnvTfConfig{"TF_CONFIG", "", "cluster and task, TensorFlow's format"};
inline constexpr EnvVar kEnvJob{"DTRAIN_JOB", "", "job name"};
inline constexpr EnvVar kEnvRunDir{"DTRAIN_RUN_DIR", "", "absolute run directory"};
inline constexpr EnvVar kEnvAttempt{"DTRAIN_ATTEMPT", "0", "group start count, 0 first"};
inline constexpr EnvVar kEnvToken{"DTRAIN_TOKEN", "", "per-job secret (hex) for peer auth"};
inline constexpr EnvVar kEnvControl{"DTRAIN_CONTROL", "", "launcher address for heartbeats"};
inline constexpr EnvVar kEnvOmpThreads{"OMP_NUM_THREADS", "", "threads per worker"};
inline constexpr EnvVar kEnvCudaDevices{"CUDA_VISIBLE_DEVICES", "", "GPU of this worker"};
inline constexpr EnvVar kEnvLogLevel{"DTRAIN_LOG_LEVEL", "info", "trace|debug|info|warn|error"};
inline constexpr EnvVar kEnvNoColor{"NO_COLOR", "", "any value turns colour off"};

/// The variable's value, or nullopt when it is unset (an empty value counts as set).
std::optional<std::string> get_env(const EnvVar& var);

/// The variable's value, or its default when unset.
std::string get_env_or_default(const EnvVar& var);

/// True for the names the launcher sets for each worker, which a job's `env` may not override:
/// TF_CONFIG, DTRAIN_JOB, DTRAIN_RUN_DIR, DTRAIN_ATTEMPT, DTRAIN_TOKEN, DTRAIN_CONTROL.
bool is_reserved_env_name(std::string_view name);

}  // namespace dtrain::common
