// torchrun's environment for every training task, so an unchanged PyTorch program
// (init_process_group with env://) runs, restarts and resumes under `dtrain launch` as under
// torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_*, MASTER_ADDR,
// MASTER_PORT and TORCHELASTIC_*. Pure; MASTER_PORT itself is the plan's (launch_plan.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::launcher {

struct LaunchPlan;
struct TaskPlan;

/// torchrun's variables for task at the given group attempt and MASTER_PORT (0: not set); empty
/// for tasks outside the training group (an evaluator). Names the job's own `env` sets are left
/// out (the job wins). Pure.
std::vector<std::pair<std::string, std::string>> torch_env(const LaunchPlan& plan,
                                                           const TaskPlan& task, int attempt,
                                                           int master_port);

}  // namespace dtrain::launcher
