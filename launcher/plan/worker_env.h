// What each worker is started with (docs/design.md#environment-variables): argv, TF_CONFIG, the
// DTRAIN_* variables, torchrun's variables, OMP_NUM_THREADS, the job's env, and for other hosts
// the remote shell or srun command. A pure function of the launch plan, the task and the
// attempt: it resolves nothing and starts nothing.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launcher/placement/process_spawner.h"
#include "launcher/plan/launch_plan.h"

namespace dtrain::launcher {

/// What changes from one start of the group, or of one replacement, to the next.
struct AttemptParams {
  int attempt = 0;      ///< DTRAIN_ATTEMPT, TORCHELASTIC_RESTART_COUNT
  int master_port = 0;  ///< MASTER_PORT of this start (0: not set)
  /// TF_CONFIG's cluster when the launcher picked other ports for this start
  /// (cluster_json_with_ports); empty: the plan's.
  std::string_view cluster_json = {};
  /// DTRAIN_GENERATION: 0 at each start of the group, then the generation a replacement joins
  /// (docs/design.md#in-place-recovery).
  int generation = 0;
  /// DTRAIN_MEMBERS of an elastic job (docs/design.md#elastic-membership): the generation's
  /// ring ranks ("" = every one).
  std::string members = {};
  /// An elastic job's task joining again on a host that came back: it starts as a spare named
  /// after the task, loads and warms up, and asks to be let in.
  bool joining = false;
  /// TORCHELASTIC_RESTART_COUNT: the group's restarts within this launch (torchrun's count; the
  /// attempt goes on across launches of the run directory).
  int restarts = 0;
};

/// The request that starts task for the given attempt and generation.
SpawnRequest make_spawn_request(const LaunchPlan& plan, const TaskPlan& task,
                                const AttemptParams& attempt);

/// A command that only shows whether task's host (or Slurm node) can start anything now: `true`
/// through the job's remote shell or srun (docs/design.md#elastic-membership). Empty argv for a
/// local task.
SpawnRequest make_probe_request(const LaunchPlan& plan, const TaskPlan& task);

/// The task's TF_CONFIG text, with cluster_json as the cluster ("" = the plan's): what a promoted
/// spare is told to be.
std::string task_tf_config(const LaunchPlan& plan, const TaskPlan& task,
                           std::string_view cluster_json);

/// TF_CONFIG's cluster text with each task on ports[i] (plan order) instead of its planned port.
std::string cluster_json_with_ports(const LaunchPlan& plan, const std::vector<int>& ports);

/// 64 hex digits from the kernel's random source. Throws IoError.
std::string random_token();

}  // namespace dtrain::launcher
