// See torch_env.h. RANK is TF_CONFIG's ring rank (chief 0, then the workers), so a program that
// reads either environment sees the same order; hosts are numbered in rank order of first use.
#include "launcher/torch_env.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/ports.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {
namespace {

// The ports the cluster's tasks listen on (any host): MASTER_PORT must be none of them.
std::set<int> task_ports(const common::ClusterSpec& cluster) {
  std::set<int> ports;
  for (const common::TaskId& task : cluster.tasks())
    ports.insert(common::parse_host_port(cluster.address(task), task.text()).port);
  return ports;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool user_sets(const LaunchContext& c, const char* name) {
  return std::any_of(c.spec->env.begin(), c.spec->env.end(),
                     [&](const auto& kv) { return kv.first == name; });
}

}  // namespace

std::string task_place(const LaunchContext& c, const common::TaskId& task) {
  if (c.slurm) return c.slurm->tasks.at(static_cast<size_t>(task.index)).node;
  std::string host = common::parse_host_port(c.cluster.address(task), task.text()).host;
  return is_local_host(host) ? "" : lower(host);
}

bool master_is_local(const LaunchContext& c) {
  return !c.slurm && task_place(c, c.cluster.chief()).empty();
}

int choose_master_port(const LaunchContext& c) {
  if (c.spec->master_port) return *c.spec->master_port;
  if (user_sets(c, common::kEnvMasterPort.name)) return 0;  // the job's own value is used
  std::set<int> taken = task_ports(c.cluster);
  if (master_is_local(c)) {
    // Ask for a few at once: one of them could be a task's (the OS does not know the cluster).
    for (int port : common::pick_free_ports(static_cast<int>(taken.size()) + 1)) {
      if (!taken.count(port)) return port;
    }
  }
  common::TaskId chief = c.cluster.chief();
  int port = common::parse_host_port(c.cluster.address(chief), chief.text()).port + 1;
  while (port <= 65535 && taken.count(port)) ++port;
  if (port > 65535) {
    spdlog::warn(
        "{}: no port above the chief's is left for MASTER_PORT, so it is not set (a PyTorch "
        "program needs it: set \"master_port\" or MASTER_PORT in \"env\")",
        c.spec->source);
    return 0;
  }
  return port;
}

std::vector<std::pair<std::string, std::string>> torch_env(const LaunchContext& c,
                                                           const common::TaskId& task,
                                                           int attempt) {
  std::optional<int> rank = c.cluster.ring_rank(task);
  if (!rank) return {};  // an evaluator: not part of the process group
  std::vector<common::TaskId> group = c.cluster.training_tasks();
  std::vector<std::string> places;  // distinct hosts, in rank order of first use
  std::string here = task_place(c, task);
  int local_rank = 0, local_size = 0;
  for (const common::TaskId& member : group) {
    std::string place = task_place(c, member);
    if (std::find(places.begin(), places.end(), place) == places.end()) places.push_back(place);
    if (place != here) continue;
    local_rank += c.cluster.ring_rank(member) < rank ? 1 : 0;
    ++local_size;
  }
  auto group_rank = std::find(places.begin(), places.end(), here) - places.begin();
  common::TaskId chief = c.cluster.chief();
  std::string master = common::parse_host_port(c.cluster.address(chief), chief.text()).host;
  std::string world = std::to_string(group.size());
  using namespace common;
  std::vector<std::pair<std::string, std::string>> all = {
      {kEnvRank.name, std::to_string(*rank)},
      {kEnvLocalRank.name, std::to_string(local_rank)},
      {kEnvWorldSize.name, world},
      {kEnvLocalWorldSize.name, std::to_string(local_size)},
      {kEnvGroupRank.name, std::to_string(group_rank)},
      {kEnvGroupWorldSize.name, std::to_string(places.size())},
      {kEnvRoleName.name, kEnvRoleName.default_value},
      {kEnvRoleRank.name, std::to_string(*rank)},
      {kEnvRoleWorldSize.name, world},
      {kEnvMasterAddr.name, master},
      {kEnvMasterPort.name, std::to_string(c.master_port)},
      {kEnvRestartCount.name, std::to_string(attempt)},
      {kEnvMaxRestarts.name, std::to_string(c.spec->restart.max_restarts)},
      {kEnvRunId.name, c.spec->job},
      {kEnvUseAgentStore.name, kEnvUseAgentStore.default_value},
  };
  std::vector<std::pair<std::string, std::string>> env;
  for (auto& kv : all) {
    if (kv.first == kEnvMasterPort.name && c.master_port == 0) continue;  // none was chosen
    if (!user_sets(c, kv.first.c_str())) env.push_back(std::move(kv));
  }
  return env;
}

}  // namespace dtrain::launcher
