// The one list of environment variables dtrain reads or sets, with their defaults.
// Who sets what is in docs/design.md#environment-variables; this file only names them.
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
inline constexpr EnvVar kEnvGeneration{"DTRAIN_GENERATION", "0",
                                       "re-formations in place within the attempt, 0 first"};
inline constexpr EnvVar kEnvRecovery{"DTRAIN_RECOVERY", "restart",
                                     "in_place: the launcher answers reform requests"};
inline constexpr EnvVar kEnvMembers{
    "DTRAIN_MEMBERS", "",
    "elastic: the ring ranks training in this generation (0,2,3); unset: every rank"};
inline constexpr EnvVar kEnvSpare{"DTRAIN_SPARE", "", "a standby dtrain-worker's name (spare:N)"};
inline constexpr EnvVar kEnvProgressFile{"DTRAIN_PROGRESS_FILE", "",
                                         "where a training worker keeps its progress record"};
inline constexpr EnvVar kEnvToken{"DTRAIN_TOKEN", "", "per-job secret (hex) for peer auth"};
inline constexpr EnvVar kEnvControl{"DTRAIN_CONTROL", "", "launcher address for heartbeats"};
inline constexpr EnvVar kEnvConfigText{"DTRAIN_CONFIG_TEXT", "",
                                       "the job file's text, for a worker on another host"};
inline constexpr EnvVar kEnvPythonUnbuffered{"PYTHONUNBUFFERED", "1",
                                             "set for command jobs: Python writes lines at once"};
inline constexpr EnvVar kEnvOmpThreads{"OMP_NUM_THREADS", "", "threads per worker"};
inline constexpr EnvVar kEnvCudaDevices{"CUDA_VISIBLE_DEVICES", "", "GPU of this worker"};
// torchrun's variables (launcher/plan/torch_env.h, docs/tf-config.md), for PyTorch programs.
inline constexpr EnvVar kEnvRank{"RANK", "", "training rank, TF_CONFIG's ring order"};
inline constexpr EnvVar kEnvLocalRank{"LOCAL_RANK", "", "rank among the host's tasks"};
inline constexpr EnvVar kEnvWorldSize{"WORLD_SIZE", "", "training tasks"};
inline constexpr EnvVar kEnvLocalWorldSize{"LOCAL_WORLD_SIZE", "", "training tasks on the host"};
inline constexpr EnvVar kEnvGroupRank{"GROUP_RANK", "", "index of the host (torchrun's node)"};
inline constexpr EnvVar kEnvGroupWorldSize{"GROUP_WORLD_SIZE", "", "hosts with training tasks"};
inline constexpr EnvVar kEnvRoleName{"ROLE_NAME", "default", "torchrun's role"};
inline constexpr EnvVar kEnvRoleRank{"ROLE_RANK", "", "= RANK (one role)"};
inline constexpr EnvVar kEnvRoleWorldSize{"ROLE_WORLD_SIZE", "", "= WORLD_SIZE (one role)"};
inline constexpr EnvVar kEnvMasterAddr{"MASTER_ADDR", "", "the chief's host"};
inline constexpr EnvVar kEnvMasterPort{"MASTER_PORT", "", "rank 0's TCPStore port"};
inline constexpr EnvVar kEnvRestartCount{"TORCHELASTIC_RESTART_COUNT", "0",
                                         "group restarts in this launch"};
inline constexpr EnvVar kEnvMaxRestarts{"TORCHELASTIC_MAX_RESTARTS", "", "restart.max_restarts"};
inline constexpr EnvVar kEnvRunId{"TORCHELASTIC_RUN_ID", "", "the job name"};
inline constexpr EnvVar kEnvUseAgentStore{"TORCHELASTIC_USE_AGENT_STORE", "False",
                                          "rank 0 hosts the store itself"};
inline constexpr EnvVar kEnvLogLevel{"DTRAIN_LOG_LEVEL", "info", "trace|debug|info|warn|error"};
inline constexpr EnvVar kEnvNoColor{"NO_COLOR", "", "any value turns colour off"};
// Test only: "RANK:MS" makes dtrain-worker rank RANK sleep MS ms in each training step's compute
// part (CPU), so that tests can make it the group's straggler; "RANK:MS:cpu" spends them spinning
// on the CPU instead (a step that a CPU quota can starve).
inline constexpr EnvVar kEnvTestSlowStepMs{"DTRAIN_TEST_SLOW_STEP_MS", "",
                                           "test only: RANK:MS, slow one worker's steps"};
// Test only: "RANK:STEP" makes dtrain-worker rank RANK, when started with the job (generation 0,
// not a replacement), spin on the CPU for ever before its global step STEP: a worker stuck in a
// loop, which the freeze watch must find (docs/design.md#frozen-workers).
inline constexpr EnvVar kEnvTestSpinAtStep{"DTRAIN_TEST_SPIN_AT_STEP", "",
                                           "test only: RANK:STEP, one worker spins for ever"};

/// The variable's value, or nullopt when it is unset (an empty value counts as set).
std::optional<std::string> get_env(const EnvVar& var);

/// The variable's value, or its default when unset.
std::string get_env_or_default(const EnvVar& var);

/// True for the names the launcher sets for each worker, which a job's `env` may not override:
/// TF_CONFIG, DTRAIN_JOB, DTRAIN_RUN_DIR, DTRAIN_ATTEMPT, DTRAIN_GENERATION, DTRAIN_RECOVERY,
/// DTRAIN_TOKEN, DTRAIN_CONTROL, DTRAIN_CONFIG_TEXT.
bool is_reserved_env_name(std::string_view name);

}  // namespace dtrain::common
