// torchrun's environment for every training task, so an unchanged PyTorch program
// (init_process_group with env://) runs, restarts and resumes under `dtrain launch` as under
// torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_*, MASTER_ADDR,
// MASTER_PORT and TORCHELASTIC_*. Pure, but for picking a free MASTER_PORT; starts nothing.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/cluster_spec.h"
#include "common/job_spec.h"

namespace dtrain::launcher {

struct LaunchContext;

/// Where a task runs, for LOCAL_RANK and GROUP_RANK: its Slurm node, "" for this machine (any of
/// its names), else the host as written, lower-cased.
std::string task_place(const LaunchContext& context, const common::TaskId& task);

/// True when the chief runs on this machine (not over ssh, not as a Slurm step), so its
/// MASTER_PORT can be picked and checked here.
bool master_is_local(const LaunchContext& context);

/// The port rank 0's TCPStore listens on. The job's master_port when set; 0 (none: nothing to
/// pick or check) when the job's `env` sets MASTER_PORT itself; else, for a chief on this
/// machine, a port the OS reports free that no task of the cluster uses; else (a chief on
/// another host or a Slurm node) the first port above the chief's own that no task uses, or 0
/// with a warning when none is left (MASTER_PORT is then not set: only a program that reads it
/// needs it). Throws IoError when no free port can be had here.
int choose_master_port(const LaunchContext& context);

/// torchrun's variables for task at the given group attempt; empty for tasks outside the
/// training group (an evaluator). Names the job's own `env` sets are left out (the job wins).
std::vector<std::pair<std::string, std::string>> torch_env(const LaunchContext& context,
                                                           const common::TaskId& task, int attempt);

}  // namespace dtrain::launcher
