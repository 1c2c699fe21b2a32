// The job file (`dtrain launch job.json`): parsing and validation of every key docs/job-file.md
// lists. The `train` object is checked only for being an object and is kept as JSON text for the
// worker, which owns its schema. Ports of a `"workers": N` job are picked by resolve_cluster().
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/cluster_spec.h"

namespace dtrain::common {

/// The `restart` object, with its defaults.
struct RestartPolicy {
  int max_restarts = 3;               ///< budget for failures
  int max_preemptions = 100;          ///< separate, larger budget for preemptions
  double backoff_seconds = 1.0;       ///< first back-off; doubles per consecutive failure
  double backoff_max_seconds = 30.0;  ///< cap of the doubling
  double grace_seconds = 10.0;        ///< SIGTERM -> SIGKILL grace, shared by the whole group
  double startup_seconds = 30.0;      ///< a group silent this long after start "never started"
  double healthy_seconds = 60.0;      ///< running this long resets the back-off
};

/// The `slurm` object of a `"cluster": "slurm"` job (launcher/placement/slurm.h,
/// docs/multi-host.md). What the launcher takes from the allocation it runs in; nodes..sbatch shape
/// `dtrain slurm-script`.
struct SlurmOptions {
  /// Worker i listens on port_base + i, so tasks on nodes that share an address never collide;
  /// unset: derived from SLURM_JOB_ID (20000-32191, below Linux's ephemeral range).
  std::optional<int> port_base;
  std::vector<std::string> srun{"srun"};  ///< the program (and first arguments) that starts steps
  int nodes = 1;                          ///< slurm-script: #SBATCH --nodes
  int tasks_per_node = 1;                 ///< slurm-script: one task per worker
  int cpus_per_task = 0;                  ///< 0: not asked for (the allocation's CPUs are split)
  int gpus_per_task = 0;                  ///< slurm-script: #SBATCH --gpus-per-task
  std::string time;                       ///< slurm-script: #SBATCH --time ("" = the default)
  std::string partition;                  ///< slurm-script: #SBATCH --partition
  /// slurm-script: Slurm sends SIGTERM to the steps this long before the time limit; unset:
  /// restart.grace_seconds + 60.
  std::optional<double> signal_lead_seconds;
  std::vector<std::string> sbatch;  ///< slurm-script: more #SBATCH options, as written
};

/// The `success` key: which tasks must exit 0 for the job to succeed.
enum class SuccessRule {
  kAllTasks,   ///< "all": every training task (the default)
  kChiefOnly,  ///< "chief": the chief alone; the others are then stopped
};

/// "all" or "chief", as the job file spells it.
const char* success_rule_name(SuccessRule rule);

/// The `recovery` key (docs/design.md#in-place-recovery): what follows a training task's failure.
enum class RecoveryMode {
  kInPlace,  ///< "in_place": the others keep running, a replacement joins (dtrain-worker only)
  kRestart,  ///< "restart": the whole group stops and starts again from the newest checkpoint
};

/// "in_place" or "restart", as the job file spells it.
const char* recovery_mode_name(RecoveryMode mode);

/// The freeze watch's default floor: a shared machine's checkpoint or epoch end stays under it.
inline constexpr double kDefaultFreezeSeconds = 10;

struct JobSpec {
  std::string source;  ///< where it was read from, for messages
  std::string job;
  /// Explicit cluster; empty (no jobs) when auto_workers > 0 until resolve_cluster().
  ClusterSpec cluster;
  int auto_workers = 0;  ///< "workers": N (local job, ports picked at launch)
  /// "cluster": "slurm": the workers are the tasks of the Slurm allocation dtrain runs in, and
  /// cluster stays empty until the launcher reads the allocation.
  bool slurm = false;
  SlurmOptions slurm_options;
  RestartPolicy restart;
  std::optional<std::string> train_json;  ///< compact JSON of `train`
  std::vector<std::string> command;       ///< empty: the bundled dtrain-worker
  std::vector<std::pair<std::string, std::string>> env;
  std::string run_dir;  ///< as written, or runs/<job>
  std::optional<double> hang_timeout_seconds;
  /// The freeze watch's floor (docs/design.md#frozen-workers): a member is judged frozen only
  /// after max(this, 20 median steps) of its own time without progress; 0 turns the watch off.
  double freeze_seconds = kDefaultFreezeSeconds;
  std::vector<std::string> remote_shell{"ssh"};
  /// "all": the job succeeds when every training task exits 0; "chief": when the chief does.
  SuccessRule success = SuccessRule::kAllTasks;
  /// Several local workers may share one GPU (else more local workers than GPUs is refused).
  bool gpu_sharing = false;
  /// MASTER_PORT of torchrun's variables (launcher/plan/torch_env.h); unset: the launcher picks
  /// one.
  std::optional<int> master_port;
  /// What the job asks for; the launch plan may still restart (launcher/plan/launch_plan.h).
  /// Default: in place for dtrain-worker jobs, restart for `command` jobs (a program that owns its
  /// state).
  RecoveryMode recovery = RecoveryMode::kInPlace;
  /// Standby dtrain-workers, promoted to a failed task's place (docs/design.md#in-place-recovery).
  int spares = 0;
  /// "elastic": {"min_workers": m} (docs/design.md#elastic-membership): training tasks that
  /// cannot be replaced (their host is unreachable) leave the group while at least m train, and
  /// join again when their host answers. 0: not elastic.
  int elastic_min_workers = 0;
  /// elastic.host_discovery: a program that prints the hosts available now, one per line (as
  /// Horovod's --host-discovery-script), run every elastic_discovery_seconds. Empty: none.
  std::vector<std::string> elastic_discovery;
  double elastic_discovery_seconds = 5;
};

inline constexpr int kMaxSpares = 64;

/// Parses job-file text. Every error is a ConfigError "<source>: <json path>: <what was found and
/// what was expected>"; unknown keys are errors.
JobSpec parse_job_spec(std::string_view text, const std::string& source);

/// Reads and parses a job file; an unreadable file is a ConfigError naming it.
JobSpec load_job_spec(const std::string& path);

/// The job's cluster with every port known: the explicit cluster, or for "workers": N that many
/// "localhost:<port>" addresses with ports the OS reports free right now.
ClusterSpec resolve_cluster(const JobSpec& spec);

/// The job as JSON (for spec.json), with the given resolved cluster in place of cluster/workers.
std::string job_spec_to_json(const JobSpec& spec, const ClusterSpec& resolved);

}  // namespace dtrain::common
