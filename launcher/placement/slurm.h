// `"cluster": "slurm"` jobs: the workers are the tasks of the Slurm allocation `dtrain launch`
// runs in (sbatch or salloc), each started as its own job step (`srun ... dtrain agent`), so
// Slurm accounts for it, signals it and cleans it up. Reading the allocation (SLURM_* variables
// and `scontrol show node`), the srun command line, and the sbatch script of `dtrain
// slurm-script`. The parsers are pure; only read_slurm_allocation's runner starts a process.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cluster_spec.h"
#include "common/job_spec.h"

namespace dtrain::launcher {

/// One worker: the allocation's tasks in node order, a node's tasks one after the other.
struct SlurmTask {
  std::string node;     ///< Slurm's node name (srun --nodelist)
  std::string address;  ///< "NodeAddr:port", as TF_CONFIG lists it
  int cpus = 1;         ///< CPUs of the step, and the worker's OMP_NUM_THREADS
  int gpus = 0;         ///< GPUs of the step (srun --gres=gpu:N); Slurm sets CUDA_VISIBLE_DEVICES
};

struct SlurmAllocation {
  std::string job_id;
  std::vector<SlurmTask> tasks;
  /// The cluster TF_CONFIG lists: {"worker": [task addresses]}.
  common::ClusterSpec cluster() const;
};

/// Slurm's compressed host list ("n[1-3,07],gpu-a[01-02]x,login") in order. Throws ConfigError
/// (what names where the list came from) on a malformed list.
std::vector<std::string> expand_hostlist(std::string_view list, const std::string& what);

/// SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE ("2(x3),1") expanded to one count per node;
/// the result must have nodes entries. Throws ConfigError naming what.
std::vector<int> parse_per_node_counts(std::string_view text, size_t nodes,
                                       const std::string& what);

/// Node name -> NodeAddr from `scontrol -o show node` output (one node per line, key=value).
std::map<std::string, std::string> parse_node_addresses(std::string_view scontrol_output);

/// Why Slurm is taking a node away, from `scontrol -o show node <node>` output: "" when the
/// node's State lets it host the job (IDLE, MIXED, ALLOCATED, ...), else the whole State text
/// ("MIXED+DRAIN", "DOWN*", ...) when it is drained or draining, down, failing, not responding,
/// or about to reboot or power down. A draining node still runs the job's new steps (srun does
/// not refuse them), so only this tells an elastic job that the node's workers should not come
/// back there. A node the output does not list counts as leaving ("not listed").
std::string node_leaving_state(std::string_view scontrol_output, const std::string& node);

/// The default first port of a job: 20000 + 64 * (job id mod 190), so concurrent jobs on shared
/// nodes differ and every port stays below Linux's ephemeral range (32768).
int default_port_base(const std::string& job_id);

using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
/// Runs argv and returns its stdout; throws (ConfigError or IoError) naming the command when it
/// cannot run, fails or times out.
using CommandRunner = std::function<std::string(const std::vector<std::string>& argv)>;

/// Reads the allocation this process runs in. Throws ConfigError naming the variable when there
/// is none (not under sbatch/salloc) or it is malformed, or when a port would pass 65535.
SlurmAllocation read_slurm_allocation(const common::JobSpec& spec, const EnvLookup& env,
                                      const CommandRunner& run);
/// The same, from the real environment and `scontrol` (a 20 s time-out).
SlurmAllocation read_slurm_allocation(const common::JobSpec& spec);

/// Runs argv to its end or timeout_seconds (then SIGKILL) and returns its stdout; stderr is
/// kept for the error message. Throws ConfigError when the program is missing, IoError when it
/// fails or times out.
std::string run_and_capture(const std::vector<std::string>& argv, double timeout_seconds);

/// The command whose output node_leaving_state reads: `scontrol -o show node <node>`. The
/// supervisor runs it as a side run on its event loop (docs/design.md#elastic-membership).
std::vector<std::string> node_state_argv(const std::string& node);

/// The argv that starts task as its own job step running `dtrain agent`: spec's srun, one task on
/// the task's node with its CPUs (--exact, so steps side by side each get their own), its GPUs,
/// a step name "<job>-<task>", and no srun chatter. The agent stops its group signal_grace
/// seconds after Slurm signals the step.
std::vector<std::string> srun_argv(const common::JobSpec& spec, const SlurmAllocation& allocation,
                                   size_t task, const std::string& dtrain_program);

/// `dtrain slurm-script`: a bash sbatch script that runs `dtrain launch job_file` in cwd with
/// spec's nodes and tasks (one per worker), --requeue, --signal=TERM@lead and append-mode
/// output, and requeues the job itself when the launch ends preempted (143).
std::string slurm_script(const common::JobSpec& spec, const std::string& job_file,
                         const std::string& dtrain_program, const std::string& cwd);

}  // namespace dtrain::launcher
