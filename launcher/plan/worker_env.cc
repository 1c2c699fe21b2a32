// See worker_env.h.
#include "launcher/plan/worker_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/json.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/plan/torch_env.h"
#include "launcher/process/shell_quote.h"

namespace dtrain::launcher {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

bool user_sets(const common::JobSpec& spec, const char* name) {
  return std::any_of(spec.env.begin(), spec.env.end(),
                     [&](const auto& kv) { return kv.first == name; });
}

// TensorFlow's exact format (common/tf_config.h), from the cluster text the plan made once.
std::string tf_config(const LaunchPlan& plan, const TaskPlan& task, std::string_view cluster) {
  return fmt::format("{{\"cluster\": {}, \"task\": {{\"type\": {}, \"index\": {}}}}}",
                     cluster.empty() ? std::string_view(plan.cluster_json) : cluster,
                     common::json_quote(task.task.type), task.task.index);
}

// A spare's (docs/design.md#in-place-recovery): no TF_CONFIG (the task it will be comes with its
// promotion), no torchrun variables; DTRAIN_SPARE names it.
Env spare_env(const LaunchPlan& plan, const TaskPlan& spare, const AttemptParams& attempt) {
  using namespace common;
  const LaunchContext& c = plan.context;
  Env env = {
      {kEnvSpare.name, spare.task.text()}, {kEnvJob.name, c.spec->job},
      {kEnvRunDir.name, c.run_dir},        {kEnvAttempt.name, std::to_string(attempt.attempt)},
      {kEnvToken.name, c.token},           {kEnvControl.name, c.control_address},
      {kEnvRecovery.name, "in_place"},     {kEnvProgressFile.name, spare.progress_path},
  };
  // Elastic: it learns the generation's members with its promotion.
  if (plan.elastic_min_workers > 0) env.emplace_back(kEnvMembers.name, attempt.members);
  if (spare.omp_threads > 0)
    env.emplace_back(kEnvOmpThreads.name, std::to_string(spare.omp_threads));
  for (const auto& kv : c.spec->env) env.push_back(kv);
  return env;
}

Env worker_env(const LaunchPlan& plan, const TaskPlan& task, const AttemptParams& attempt) {
  using namespace common;
  const LaunchContext& c = plan.context;
  if (task.spare()) return spare_env(plan, task, attempt);
  if (attempt.joining) {  // a spare that can take only its own task's place
    Env env = spare_env(plan, task, attempt);
    env.front().second = task.task.text();
    env.erase(std::remove_if(env.begin(), env.end(),
                             [](const auto& kv) { return kv.first == kEnvProgressFile.name; }),
              env.end());
    if (!task.progress_path.empty()) env.emplace_back(kEnvProgressFile.name, task.progress_path);
    if (task.remote() && !c.spec_text.empty()) env.emplace_back(kEnvConfigText.name, c.spec_text);
    return env;
  }
  Env env = {
      {kEnvTfConfig.name, tf_config(plan, task, attempt.cluster_json)},
      {kEnvJob.name, c.spec->job},
      {kEnvRunDir.name, c.run_dir},
      {kEnvAttempt.name, std::to_string(attempt.attempt)},
      {kEnvGeneration.name, std::to_string(attempt.generation)},
      {kEnvToken.name, c.token},
      {kEnvControl.name, c.control_address},
  };
  // Only the training tasks re-form; the evaluator reads checkpoints and never joins the ring.
  if (plan.in_place && task.trains()) env.emplace_back(kEnvRecovery.name, "in_place");
  if (plan.elastic_min_workers > 0 && task.trains() && c.spec->command.empty())
    env.emplace_back(kEnvMembers.name, attempt.members);
  if (!task.progress_path.empty()) env.emplace_back(kEnvProgressFile.name, task.progress_path);
  if (task.omp_threads > 0) env.emplace_back(kEnvOmpThreads.name, std::to_string(task.omp_threads));
  if (!task.gpu.empty()) env.emplace_back(kEnvCudaDevices.name, task.gpu);
  for (auto& kv : torch_env(plan, task, attempt.restarts, attempt.master_port))
    env.push_back(std::move(kv));
  // A Python program's print() reaches the log at once, not when a pipe buffer fills.
  if (!c.spec->command.empty() && !user_sets(*c.spec, kEnvPythonUnbuffered.name))
    env.emplace_back(kEnvPythonUnbuffered.name, kEnvPythonUnbuffered.default_value);
  for (const auto& kv : c.spec->env) env.push_back(kv);
  // dtrain-worker on another host reads the job from here, so it needs no shared file system.
  if (task.remote() && c.spec->command.empty() && !c.spec_text.empty())
    env.emplace_back(kEnvConfigText.name, c.spec_text);
  return env;
}

std::vector<std::string> program_argv(const LaunchContext& c) {
  if (!c.spec->command.empty()) return c.spec->command;
  return {c.worker_program, "--config", c.spec_path};
}

std::vector<std::string> remote_shell_argv(const LaunchPlan& plan, const TaskPlan& task) {
  const common::JobSpec& spec = plan.spec();
  std::vector<std::string> argv = spec.remote_shell;
  argv.push_back("--");  // the host is never an option, whatever the cluster spec says
  argv.push_back(task.endpoint.host);
  argv.push_back(shell_quote(plan.context.dtrain_program));  // the remote shell joins its words
  argv.push_back("agent");
  argv.push_back("--keepalive");
  argv.push_back(fmt::format("{}", kAgentKeepaliveSeconds));
  argv.push_back("--signal-grace");
  argv.push_back(fmt::format("{:g}", spec.restart.grace_seconds));
  return argv;
}

}  // namespace

SpawnRequest make_spawn_request(const LaunchPlan& plan, const TaskPlan& task,
                                const AttemptParams& attempt) {
  const LaunchContext& c = plan.context;
  SpawnRequest request;
  request.env = worker_env(plan, task, attempt);
  request.argv = program_argv(c);
  request.cwd = c.cwd;
  switch (task.placement) {
    case Placement::kLocal:
      return request;
    case Placement::kRemoteShell:
      request.remote = RemoteTarget{RemoteTarget::Kind::kRemoteShell, task.where,
                                    plan.spec().restart.startup_seconds};
      break;
    case Placement::kSlurmStep:
      request.remote = RemoteTarget{RemoteTarget::Kind::kSlurmStep, task.where,
                                    plan.spec().restart.startup_seconds};
      break;
  }
  // `<remote_shell> host dtrain agent` or `srun ... dtrain agent`; argv, env (the token among
  // them) and cwd travel on stdin, never on a command line.
  request.agent_request = format_agent_request({request.argv, request.env, c.cwd});
  request.env.clear();
  request.cwd.clear();
  request.argv = task.placement == Placement::kSlurmStep
                     ? srun_argv(plan.spec(), *c.slurm, task.slurm_index, c.dtrain_program)
                     : remote_shell_argv(plan, task);
  return request;
}

SpawnRequest make_probe_request(const LaunchPlan& plan, const TaskPlan& task) {
  const LaunchContext& c = plan.context;
  SpawnRequest request;
  request.cwd = c.cwd;
  switch (task.placement) {
    case Placement::kLocal:
      break;
    case Placement::kRemoteShell:
      request.argv = plan.spec().remote_shell;
      request.argv.insert(request.argv.end(), {"--", task.endpoint.host, "true"});
      break;
    case Placement::kSlurmStep: {  // the task's own step options, running `true`
      request.argv = srun_argv(plan.spec(), *c.slurm, task.slurm_index, "true");
      // The program's arguments follow it; the srun options (the job's own too) come before.
      auto program = std::find(request.argv.rbegin(), request.argv.rend(), "true");
      request.argv.resize(static_cast<size_t>(request.argv.rend() - program));
      break;
    }
  }
  return request;
}

std::string task_tf_config(const LaunchPlan& plan, const TaskPlan& task,
                           std::string_view cluster_json) {
  return tf_config(plan, task, cluster_json);
}

std::string cluster_json_with_ports(const LaunchPlan& plan, const std::vector<int>& ports) {
  DT_ENFORCE_EQ(ports.size(), plan.tasks.size(), "one port per task");
  std::vector<common::ClusterSpec::Job> jobs;
  size_t i = 0;  // ClusterSpec::tasks() order, job by job: the plan's order
  for (const auto& [type, addresses] : plan.context.cluster.jobs()) {
    std::vector<std::string> moved;
    for (size_t k = 0; k < addresses.size(); ++k, ++i) {
      const std::string& host = plan.tasks[i].endpoint.host;
      bool v6 = host.find(':') != std::string::npos;
      moved.push_back(fmt::format("{}{}{}:{}", v6 ? "[" : "", host, v6 ? "]" : "", ports[i]));
    }
    jobs.emplace_back(type, std::move(moved));
  }
  return common::ClusterSpec(std::move(jobs)).to_python_json();
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
