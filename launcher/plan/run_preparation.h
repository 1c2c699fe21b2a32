// Everything `dtrain launch` does before the first worker starts: make the run directory, take
// its lock (one launcher per run), end stale workers a dead launcher left behind, resolve ports,
// write spec.json, and find the worker program. Also the log tail used by failure summaries.
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"
#include "launcher/plan/launch_plan.h"

namespace dtrain::launcher {

struct PreparedRun {
  common::RunDir run_dir{""};
  common::UniqueFd lock;  ///< flock held for the launcher's life
  LaunchPlan plan;        ///< resolved once; the supervisor only reads it
  int first_attempt = 0;  ///< 0, or one past the last attempt of a resumed run
};

/// Throws ConfigError when the run directory is in use by a live launcher (naming its pid) or
/// the worker program cannot be found; IoError when the folder cannot be written. fresh: the
/// run's results and checkpoints (model/, metrics, TensorBoard files, the backup folder) are
/// removed first, so the job trains from scratch; logs and events are kept.
PreparedRun prepare_run(const common::JobSpec& spec, bool fresh = false);

/// True when run_dir's spec.json records the same work as spec: the same `train` section and
/// `command` (ports and restart settings may differ). A job whose training changed (more epochs,
/// say) is not the run that succeeded, and launching it goes on from its checkpoint.
bool same_work_as_recorded(const common::JobSpec& spec, const common::RunDir& run_dir);

/// What a launch of spec does with the work run_dir already holds
/// (docs/design.md#continuing-a-finished-run), said by --dry-run and the launch's first line.
struct RunStart {
  enum class Kind {
    kFresh,     ///< nothing to go on from (or --fresh): trains from scratch
    kResume,    ///< an interrupted run: from its newest checkpoint
    kContinue,  ///< a finished run whose train.epochs grew: from its final state
    kFinished,  ///< the same work already succeeded: nothing to do
    kRefused,   ///< a finished run whose training changed otherwise: exit 2
  };
  Kind kind = Kind::kFresh;
  /// "continues the finished run from epoch 3 to epoch 5 (its final state in ...)", ...; for
  /// kRefused, the whole error.
  std::string what;
};
RunStart run_start(const common::JobSpec& spec, const common::RunDir& run_dir, bool fresh);

/// The status a finished run recorded in its state.json ("succeeded", "failed", "stopped"), or
/// "" when it has none or it is unreadable.
std::string recorded_status(const common::RunDir& run_dir);

/// The run directory of spec as the launcher names it: absolute, normalised, no trailing '/'.
std::string run_root(const common::JobSpec& spec);

/// Everything the tasks of spec are started with but the token: the cluster (from Slurm for a
/// Slurm job), spec.json's text, programs, cores, GPUs and the control address. Writes no file
/// and starts nothing (picking "workers": N ports binds sockets for a moment). spec must outlive
/// the context. Throws ConfigError as prepare_run does.
LaunchContext make_launch_context(const common::JobSpec& spec, const std::string& root);

/// True when a live launcher holds run_dir's lock (the one prepare_run takes), read from
/// /proc/locks: the check takes no lock itself, so a launch starting at the same instant is
/// never refused because of it. For reports such as a dry run; a launch just takes the lock.
bool run_dir_locked(const common::RunDir& run_dir);

/// The attempt a launch of run_dir starts with: 0, or one past what its state.json recorded.
int next_attempt(const common::RunDir& run_dir);

/// Ends processes of an earlier launcher of run_dir that state.json lists as running, after
/// checking through /proc that each really belongs to this run. Returns how many it ended.
int end_stale_workers(const std::string& run_dir);

/// The last n lines of a file (fewer if it is shorter; none if unreadable).
std::vector<std::string> tail_lines(const std::string& path, size_t n);

/// The dtrain-worker program: beside this dtrain, else in the build tree (BUILD/worker/), else
/// "dtrain-worker" (looked up on PATH when started).
std::string find_worker_program();

}  // namespace dtrain::launcher
