// See torch_env.h. RANK is TF_CONFIG's ring rank (chief 0, then the workers), so a program that
// reads either environment sees the same order; hosts are numbered in rank order of first use
// (the plan's group_rank).
#include "launcher/plan/torch_env.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/env_vars.h"
#include "common/errors.h"
#include "launcher/plan/launch_plan.h"

namespace dtrain::launcher {
namespace {

bool user_sets(const LaunchPlan& plan, const std::string& name) {
  return std::any_of(plan.spec().env.begin(), plan.spec().env.end(),
                     [&](const auto& kv) { return kv.first == name; });
}

}  // namespace

std::vector<std::pair<std::string, std::string>> torch_env(const LaunchPlan& plan,
                                                           const TaskPlan& task, int attempt,
                                                           int master_port) {
  if (!task.rank) return {};  // an evaluator: not part of the process group
  std::string world = std::to_string(plan.training_tasks);
  using namespace common;
  std::vector<std::pair<std::string, std::string>> all = {
      {kEnvRank.name, std::to_string(*task.rank)},
      {kEnvLocalRank.name, std::to_string(task.local_rank)},
      {kEnvWorldSize.name, world},
      {kEnvLocalWorldSize.name, std::to_string(task.local_world_size)},
      {kEnvGroupRank.name, std::to_string(task.group_rank)},
      {kEnvGroupWorldSize.name, std::to_string(plan.places)},
      {kEnvRoleName.name, kEnvRoleName.default_value},
      {kEnvRoleRank.name, std::to_string(*task.rank)},
      {kEnvRoleWorldSize.name, world},
      {kEnvMasterAddr.name, plan.master_addr},
      {kEnvMasterPort.name, std::to_string(master_port)},
      {kEnvRestartCount.name, std::to_string(attempt)},
      {kEnvMaxRestarts.name, std::to_string(plan.spec().restart.max_restarts)},
      {kEnvRunId.name, plan.spec().job},
      {kEnvUseAgentStore.name, kEnvUseAgentStore.default_value},
  };
  std::vector<std::pair<std::string, std::string>> env;
  for (auto& kv : all) {
    if (kv.first == kEnvMasterPort.name && master_port == 0) continue;  // none was chosen
    if (!user_sets(plan, kv.first)) env.push_back(std::move(kv));
  }
  return env;
}

}  // namespace dtrain::launcher
