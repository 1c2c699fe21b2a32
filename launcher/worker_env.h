// What each worker is started with (docs/design.md#environment-variables): argv, TF_CONFIG, the
// DTRAIN_* variables, torchrun's variables, OMP_NUM_THREADS, the job's env, and for other hosts
// the remote shell.
// Pure: builds requests, starts nothing.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/cluster_spec.h"
#include "common/job_spec.h"
#include "launcher/process_spawner.h"
#include "launcher/slurm.h"

namespace dtrain::launcher {

struct LaunchContext {
  const common::JobSpec* spec = nullptr;
  common::ClusterSpec cluster;  ///< ports resolved
  std::string run_dir;          ///< absolute
  std::string spec_path;        ///< absolute spec.json, handed to dtrain-worker as --config
  std::string token;            ///< DTRAIN_TOKEN
  std::string control_address;  ///< DTRAIN_CONTROL
  std::string worker_program;   ///< absolute path of dtrain-worker
  /// dtrain itself (absolute), started as `dtrain agent` on other hosts: same path there.
  std::string dtrain_program = "dtrain";
  std::string cwd;  ///< where workers start (the launcher's folder)
  int host_cores = 1;
  std::optional<std::string> launcher_omp_threads;  ///< OMP_NUM_THREADS of the launcher, if set
  /// MASTER_PORT of torchrun's variables (launcher/torch_env.h); 0 until chosen.
  int master_port = 0;
  int local_gpus = 0;  ///< GPUs on this host; each local task gets one through CUDA_VISIBLE_DEVICES
  /// What to hand out for those GPUs: the launcher's own CUDA_VISIBLE_DEVICES entries when it
  /// has one (so "2,3" hands out 2 and 3), else empty for "0".."local_gpus - 1".
  std::vector<std::string> gpu_names;
  /// A `"cluster": "slurm"` job: the allocation (cluster is its tasks). Every task then starts
  /// as a job step through srun and `dtrain agent`, and Slurm hands out CPUs and GPUs.
  std::optional<SlurmAllocation> slurm;
};

/// The GPU (as CUDA_VISIBLE_DEVICES text) of task: local tasks take the host's GPUs round-robin
/// in task order; "" when the host has none or the task runs elsewhere.
std::string gpu_for_task(const LaunchContext& context, const common::TaskId& task);

/// Refuses (ConfigError) more local tasks than GPUs unless the job allows sharing.
void check_gpu_assignment(const LaunchContext& context);

/// The request that starts task for the given attempt.
SpawnRequest make_spawn_request(const LaunchContext& context, const common::TaskId& task,
                                int attempt);

/// True when host resolves to one of this machine's addresses (an interface address, loopback
/// included; common/local_addresses.h), not merely because it is a loopback name or the host name.
bool is_local_host(const std::string& host);

/// True when task starts through `dtrain agent` (over the remote shell, or as a Slurm step), so
/// its output carries the agent's marker lines.
bool uses_agent(const LaunchContext& context, const common::TaskId& task);

/// Single-quoted for a POSIX shell: it's -> 'it'\''s'.
std::string shell_quote(const std::string& text);

/// 64 hex digits from the kernel's random source. Throws IoError.
std::string random_token();

}  // namespace dtrain::launcher
