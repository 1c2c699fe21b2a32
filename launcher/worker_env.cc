// See worker_env.h.
#include "launcher/worker_env.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/local_addresses.h"
#include "common/tf_config.h"
#include "launcher/agent_protocol.h"
#include "launcher/torch_env.h"

namespace dtrain::launcher {
namespace {

int workers_on_host(const common::ClusterSpec& cluster, const std::string& host) {
  int count = 0;
  for (const common::TaskId& task : cluster.tasks()) {
    count += common::parse_host_port(cluster.address(task), task.text()).host == host ? 1 : 0;
  }
  return std::max(count, 1);
}

std::vector<std::pair<std::string, std::string>> worker_env(const LaunchContext& c,
                                                            const common::TaskId& task, int attempt,
                                                            const std::string& host) {
  using namespace common;
  std::vector<std::pair<std::string, std::string>> env = {
      {kEnvTfConfig.name, format_tf_config(c.cluster, task)},
      {kEnvJob.name, c.spec->job},
      {kEnvRunDir.name, c.run_dir},
      {kEnvAttempt.name, std::to_string(attempt)},
      {kEnvToken.name, c.token},
      {kEnvControl.name, c.control_address},
  };
  bool user_sets_omp = std::any_of(c.spec->env.begin(), c.spec->env.end(),
                                   [](const auto& kv) { return kv.first == kEnvOmpThreads.name; });
  if (!user_sets_omp && c.slurm) {
    env.emplace_back(kEnvOmpThreads.name, std::to_string(c.slurm->tasks.at(task.index).cpus));
  } else if (!user_sets_omp && !c.launcher_omp_threads) {
    int threads = std::max(1, c.host_cores / workers_on_host(c.cluster, host));
    env.emplace_back(kEnvOmpThreads.name, std::to_string(threads));
  }
  bool user_sets_gpu = std::any_of(c.spec->env.begin(), c.spec->env.end(),
                                   [](const auto& kv) { return kv.first == kEnvCudaDevices.name; });
  std::string gpu = gpu_for_task(c, task);
  if (!gpu.empty() && !user_sets_gpu) env.emplace_back(kEnvCudaDevices.name, gpu);
  for (auto& kv : torch_env(c, task, attempt)) env.push_back(std::move(kv));
  for (const auto& kv : c.spec->env) env.push_back(kv);
  return env;
}

std::vector<std::string> program_argv(const LaunchContext& c) {
  if (!c.spec->command.empty()) return c.spec->command;
  return {c.worker_program, "--config", c.spec_path};
}

}  // namespace

// The local tasks in task order: the order GPUs are handed out in.
std::vector<common::TaskId> local_tasks(const LaunchContext& c) {
  std::vector<common::TaskId> tasks;
  for (const common::TaskId& task : c.cluster.tasks()) {
    if (is_local_host(common::parse_host_port(c.cluster.address(task), task.text()).host))
      tasks.push_back(task);
  }
  return tasks;
}

std::string gpu_for_task(const LaunchContext& c, const common::TaskId& task) {
  if (c.local_gpus <= 0) return "";
  std::vector<common::TaskId> tasks = local_tasks(c);
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!(tasks[i] == task)) continue;
    size_t slot = i % static_cast<size_t>(c.local_gpus);
    return slot < c.gpu_names.size() ? c.gpu_names[slot] : std::to_string(slot);
  }
  return "";
}

void check_gpu_assignment(const LaunchContext& c) {
  size_t local = local_tasks(c).size();
  if (c.local_gpus > 0 && local > static_cast<size_t>(c.local_gpus) && !c.spec->gpu_sharing) {
    throw common::ConfigError(
        fmt::format("{}: {} local tasks but {} GPU(s) on this host: set \"gpu_sharing\": true to "
                    "let workers share GPUs, or use fewer workers",
                    c.spec->source, local, c.local_gpus));
  }
}

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

bool is_local_host(const std::string& host) {
  return common::is_this_machine(host);
}

bool uses_agent(const LaunchContext& c, const common::TaskId& task) {
  return c.slurm ||
         !is_local_host(common::parse_host_port(c.cluster.address(task), task.text()).host);
}

SpawnRequest make_spawn_request(const LaunchContext& c, const common::TaskId& task, int attempt) {
  std::string host = common::parse_host_port(c.cluster.address(task), task.text()).host;
  SpawnRequest request;
  request.env = worker_env(c, task, attempt, host);
  request.argv = program_argv(c);
  request.cwd = c.cwd;
  if (!uses_agent(c, task)) return request;
  // Another machine or a Slurm step: `<remote_shell> host dtrain agent` or `srun ... dtrain
  // agent`; argv, env (the token among them) and cwd travel on stdin, never on a command line.
  request.agent = true;
  request.agent_request = format_agent_request({request.argv, request.env, c.cwd});
  request.env.clear();
  request.cwd.clear();
  if (c.slurm) {
    request.argv = srun_argv(*c.spec, *c.slurm, static_cast<size_t>(task.index), c.dtrain_program);
    return request;
  }
  request.argv = c.spec->remote_shell;
  request.argv.push_back("--");  // the host is never an option, whatever the cluster spec says
  request.argv.push_back(host);
  request.argv.push_back(shell_quote(c.dtrain_program));  // the remote shell joins its arguments
  request.argv.push_back("agent");
  request.argv.push_back("--keepalive");
  request.argv.push_back(fmt::format("{}", kAgentKeepaliveSeconds));
  request.argv.push_back("--signal-grace");
  request.argv.push_back(fmt::format("{:g}", c.spec->restart.grace_seconds));
  return request;
}

std::string random_token() {
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[32];
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof bytes)) {
    throw common::IoError("cannot read /dev/urandom for DTRAIN_TOKEN");
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace dtrain::launcher
