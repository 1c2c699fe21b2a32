// torchrun's environment for every training task, so an unchanged PyTorch program
// (init_process_group with env://) runs, restarts and resumes under `dtrain launch` as under
// torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_*, MASTER_ADDR,
// MASTER_PORT and TORCHELASTIC_*. Pure, but for picking a free MASTER_PORT; starts nothing.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::launcher {

struct LaunchPlan;
struct TaskPlan;

/// The port rank 0's TCPStore listens on. The job's master_port when set; 0 (none: nothing to
/// pick or check) when the job's `env` sets MASTER_PORT itself; else, for a chief on this
/// machine, a port the OS reports free that no task of the cluster uses; else (a chief on
/// another host or a Slurm node) the first port above the chief's own that no task uses, or 0
/// with a warning when none is left (MASTER_PORT is then not set: only a program that reads it
/// needs it). Uses the plan's placements; throws IoError when no free port can be had here.
int choose_master_port(const LaunchPlan& plan);

/// torchrun's variables for task at the given group attempt and MASTER_PORT (0: not set); empty
/// for tasks outside the training group (an evaluator). Names the job's own `env` sets are left
/// out (the job wins). Pure.
std::vector<std::pair<std::string, std::string>> torch_env(const LaunchPlan& plan,
                                                           const TaskPlan& task, int attempt,
                                                           int master_port);

}  // namespace dtrain::launcher
