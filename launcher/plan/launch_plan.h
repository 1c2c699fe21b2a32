// The launch plan: where every task of a job runs and what it is started with, resolved once when
// the run is prepared (docs/design.md#launch-plan) and never changed afterwards. Host names
// are resolved here, once per distinct host, and never on the supervisor's event loop.
// Builds values only: it starts no process (picking MASTER_PORT binds a socket for a moment).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/cluster_spec.h"
#include "common/job_spec.h"
#include "launcher/placement/slurm.h"

namespace dtrain::launcher {

/// A remote task's DTRAIN_PROGRESS_FILE as the launcher sends it: the agent puts a file of its
/// own in its place and reports the record in its watch events (agent_protocol.h).
inline constexpr std::string_view kAgentProgressPath = "@agent";

/// What the plan is made from: the job and the facts of this machine that prepare_run gathers.
struct LaunchContext {
  const common::JobSpec* spec = nullptr;
  common::ClusterSpec cluster;  ///< ports resolved
  std::string run_dir;          ///< absolute
  std::string spec_path;        ///< absolute spec.json, handed to dtrain-worker as --config
  std::string spec_text;        ///< spec.json's text; remote workers get it in their request
  std::string token;            ///< DTRAIN_TOKEN
  std::string control_address;  ///< DTRAIN_CONTROL
  std::string worker_program;   ///< absolute path of dtrain-worker
  /// dtrain itself (absolute), started as `dtrain agent` on other hosts: same path there.
  std::string dtrain_program = "dtrain";
  std::string cwd;  ///< where workers start (the launcher's folder)
  int host_cores = 1;
  std::optional<std::string> launcher_omp_threads;  ///< OMP_NUM_THREADS of the launcher, if set
  int local_gpus = 0;  ///< GPUs on this host; each local task gets one through CUDA_VISIBLE_DEVICES
  /// What to hand out for those GPUs: the launcher's own CUDA_VISIBLE_DEVICES entries when it
  /// has one (so "2,3" hands out 2 and 3), else empty for "0".."local_gpus - 1".
  std::vector<std::string> gpu_names;
  /// A `"cluster": "slurm"` job: the allocation (cluster is its tasks). Every task then starts
  /// as a job step through srun and `dtrain agent`, and Slurm hands out CPUs and GPUs.
  std::optional<SlurmAllocation> slurm;
};

/// Where a task runs.
enum class Placement {
  kLocal,        ///< this machine: started directly
  kRemoteShell,  ///< another host: `<remote_shell> host dtrain agent`
  kSlurmStep,    ///< a Slurm job step: `srun ... dtrain agent`
};

/// One task, resolved.
/// The task type of a spare: "spare:0" in logs, events and state.json.
inline constexpr const char* kSpareType = "spare";

struct TaskPlan {
  common::TaskId task;
  std::string address;        ///< "host:port" as TF_CONFIG lists it
  common::HostPort endpoint;  ///< address, split
  Placement placement = Placement::kLocal;
  /// The host (remote shell) or node (Slurm) it runs on; "" on this machine.
  std::string where;
  /// For a local task: the numeric addresses its port is checked on before each start, resolved
  /// once here ("localhost": 127.0.0.1 and ::1).
  std::vector<std::string> listen_addresses;
  std::string log_path;
  /// A dtrain-worker training task's progress record (DTRAIN_PROGRESS_FILE), read by the
  /// supervisor to find a frozen member (a remote task's is kAgentProgressPath: its agent keeps
  /// it and reports it); "" for the others.
  std::string progress_path;
  /// Position in the training ring (RANK); empty for tasks that do not train (an evaluator).
  std::optional<int> rank;
  int local_rank = 0;        ///< LOCAL_RANK: rank among the training tasks of its place
  int local_world_size = 0;  ///< LOCAL_WORLD_SIZE
  int group_rank = 0;        ///< GROUP_RANK: its place, numbered in rank order of first use
  int omp_threads = 0;       ///< OMP_NUM_THREADS to set; 0 = leave it to the user or launcher
  std::string gpu;           ///< CUDA_VISIBLE_DEVICES to set; "" = none
  size_t slurm_index = 0;    ///< its task in the Slurm allocation

  bool trains() const { return rank.has_value(); }
  bool spare() const { return task.type == kSpareType; }
  bool remote() const { return placement != Placement::kLocal; }
  /// True when its place can go away and come back while the launcher runs: another machine
  /// (elastic membership lets such a host leave and rejoin); never this machine, the launcher's.
  bool place_can_leave() const { return remote(); }
  /// True when it runs on host, a place that can leave ("" is this machine's, never one).
  bool runs_on(const std::string& host) const { return place_can_leave() && where == host; }
  /// "host 10.0.0.7", "node n1", or "this machine", for messages.
  std::string place_text() const;
};

struct LaunchPlan {
  LaunchContext context;
  std::string cluster_json;     ///< TF_CONFIG's "cluster" value, the same for every task
  std::vector<TaskPlan> tasks;  ///< in cluster order (ClusterSpec::tasks())
  int training_tasks = 0;       ///< WORLD_SIZE
  int places = 0;               ///< GROUP_WORLD_SIZE: distinct places of the training tasks
  std::string master_addr;      ///< MASTER_ADDR: the chief's host
  bool master_local = false;    ///< the chief runs here, so MASTER_PORT can be checked here
  /// MASTER_PORT chosen at planning; 0 = not set (the job's env sets it, or none was left).
  int master_port = 0;
  /// Recovery in place (docs/design.md#in-place-recovery): a dtrain-worker job asks for it and
  /// trains on CPUs. Else a failure restarts the whole group.
  bool in_place = false;
  /// Why a job that asked for recovery in place restarts instead, for the launch's log: "recovery:
  /// restart (train.communication \"nccl\" can be NCCL, ...)"; "" otherwise.
  std::string recovery_note;
  /// The job's spares (docs/design.md#spares), tasks "spare:<i>" with no rank and no address,
  /// spares of them on each place of the training tasks (this machine, each ssh host); none
  /// unless in place.
  std::vector<TaskPlan> spares;
  /// Elastic (docs/design.md#elastic-membership): the fewest training tasks the group may shrink
  /// to; 0: not elastic.
  int elastic_min_workers = 0;

  const common::JobSpec& spec() const { return *context.spec; }
  /// The task's plan. Throws EnforceError for a task outside the cluster.
  const TaskPlan& task(const common::TaskId& id) const;
};

/// Resolves context into a plan: each distinct host's locality (once), placements, ranks, GPUs,
/// threads and MASTER_PORT. Throws ConfigError for more local tasks than GPUs without
/// gpu_sharing, IoError when no port can be had or the interface list cannot be read.
LaunchPlan plan_launch(LaunchContext context);

/// The port rank 0's TCPStore listens on. The job's master_port when set; 0 (none: nothing to
/// pick or check) when the job's `env` sets MASTER_PORT itself; else, for a chief on this
/// machine, a port the OS reports free that no task of the cluster uses; else (a chief on
/// another host or a Slurm node) the first port above the chief's own that no task uses, or 0
/// with a warning when none is left (MASTER_PORT is then not set: only a program that reads it
/// needs it). Uses the plan's placements; throws IoError when no free port can be had here.
int choose_master_port(const LaunchPlan& plan);

/// An elastic command job's plan for the tasks not away (docs/design.md#elastic-membership): the
/// cluster without them, the others renumbered (TF_CONFIG index, RANK, LOCAL_RANK, WORLD_SIZE
/// ...) in the same order; placement, logs and threads unchanged. The chief must stay.
LaunchPlan members_plan(const LaunchPlan& plan, const std::set<common::TaskId>& away);

/// True when host resolves to one of this machine's addresses (an interface address, loopback
/// included; common/local_addresses.h), not merely because it is a loopback name or the host
/// name. May block on the resolver: for planning, never on the event loop.
bool is_local_host(const std::string& host);

}  // namespace dtrain::launcher
