// See dry_run.h. Each task is printed as the launcher would start it: a local task as
// `cd DIR && env VAR=... PROGRAM ARGS`, a task on another host or Slurm node as the remote shell
// or srun command, then what `dtrain agent` runs there (sent on its stdin, never on a command
// line).
#include "launcher/dry_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string_view>

#include "common/cluster_spec.h"
#include "common/control_protocol.h"
#include "common/run_dir.h"
#include "launcher/agent_protocol.h"
#include "launcher/control_server.h"
#include "launcher/run_preparation.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {
namespace {

// Bare when the shell reads it as is, else single-quoted.
std::string shell_word(const std::string& text) {
  bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char ch) {
    return std::isalnum(ch) ||
           std::string_view("@%+=:,./-_").find(static_cast<char>(ch)) != std::string_view::npos;
  });
  return plain ? text : shell_quote(text);
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& word : argv) line += (line.empty() ? "" : " ") + shell_word(word);
  return line;
}

// user:password@ in URLs ("postgres://u:pw@db/x") with the password masked.
std::string mask_url_passwords(std::string value) {
  for (size_t at = value.find("://"); at != std::string::npos; at = value.find("://", at + 3)) {
    size_t user = at + 3;
    size_t end = std::min(value.find_first_of("/?#", user), value.size());
    size_t sign = value.rfind('@', end);
    if (sign == std::string::npos || sign < user) continue;
    size_t colon = value.find(':', user);
    if (colon < sign) value.replace(colon + 1, sign - colon - 1, kMaskedValue);
  }
  return value;
}

// "  cd DIR && env \\\n      VAR=value \\\n ...      PROGRAM ARGS\n".
std::string env_command(const std::string& indent, const std::string& cwd,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        const std::vector<std::string>& argv) {
  std::string out = fmt::format("{}cd {} && env \\\n", indent, shell_word(cwd));
  for (const auto& [name, value] : env) {
    std::string shown = is_secret_name(name) ? kMaskedValue : shell_word(mask_url_passwords(value));
    out += fmt::format("{}    {}={} \\\n", indent, name, shown);
  }
  return out + fmt::format("{}    {}\n", indent, command_line(argv));
}

std::string where(const LaunchPlan& plan, const TaskPlan& task) {
  switch (task.placement) {
    case Placement::kLocal:
      return fmt::format("{} (this machine)", task.endpoint.host);
    case Placement::kRemoteShell:
      return fmt::format("{} (over {})", task.endpoint.host, plan.spec().remote_shell.at(0));
    case Placement::kSlurmStep:
      return fmt::format("Slurm node {}", task.where);
  }
  return task.where;
}

std::string format_task(const LaunchPlan& plan, const TaskPlan& task, int attempt) {
  SpawnRequest request = make_spawn_request(plan, task, {attempt, plan.master_port});
  std::string out = fmt::format("{} {} on {}\n", task.task.text(), task.address, where(plan, task));
  if (!request.agent()) return out + env_command("  ", request.cwd, request.env, request.argv);
  AgentRequest remote = parse_agent_request(
      std::string_view(request.agent_request).substr(0, request.agent_request.size() - 1));
  out += fmt::format("  {}\n  what `dtrain agent` runs there (sent on its stdin):\n",
                     command_line(request.argv));
  return out + env_command("    ", remote.cwd, remote.env, remote.argv);
}

}  // namespace

bool is_secret_name(const std::string& name) {
  std::string upper = name;
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (const char* word : {"TOKEN", "SECRET", "PASS", "CREDENTIAL", "AUTH", "APIKEY", "COOKIE"}) {
    if (upper.find(word) != std::string::npos) return true;
  }
  auto ends_with = [&](std::string_view tail) {
    return upper.size() >= tail.size() &&
           upper.compare(upper.size() - tail.size(), tail.size(), tail.data(), tail.size()) == 0;
  };
  // KEY and PWD as the name's last word: SSH_KEY, AWS_ACCESS_KEY, MYSQL_PWD; not KEYBOARD or PWD.
  return upper.find("_KEY_") != std::string::npos || ends_with("_KEY") || ends_with("_PWD");
}

std::string format_dry_run(const LaunchPlan& plan, const DryRunFacts& facts) {
  const LaunchContext& c = plan.context;
  std::string out = fmt::format(
      "# dry run of job \"{}\": {} task(s), run directory {}, attempt {}; nothing was started and "
      "no file was written\n",
      c.spec->job, plan.tasks.size(), c.run_dir, facts.attempt);
  if (facts.in_use) {
    out += "# the run directory is in use by a running launcher: a launch now would refuse\n";
  }
  if (facts.succeeded && !facts.fresh) {
    out +=
        "# the run already succeeded: a launch would change nothing (--fresh trains it again "
        "from scratch)\n";
  }
  if (facts.fresh)
    out +=
        "# --fresh: the run's model, metrics, TensorBoard files and checkpoints would be removed\n";
  if (plan.master_port > 0) {
    const char* why = c.spec->master_port ? "is the job's"
                      : plan.master_local
                          ? "is free now; a launch checks it again and picks another if taken"
                          : "is the first one above the chief's port that no task uses";
    out += fmt::format("# MASTER_PORT {} {}\n", plan.master_port, why);
  }
  out += fmt::format("# secrets are shown as {}\n", kMaskedValue);
  for (const TaskPlan& task : plan.tasks) out += "\n" + format_task(plan, task, facts.attempt);
  return out;
}

std::string dry_run(const common::JobSpec& spec, bool fresh) {
  std::string root = run_root(spec);
  common::RunDir run_dir(root);
  LaunchContext context = make_launch_context(spec, root);
  context.token = std::string(64, 'x');  // masked in the report; never a real token
  LaunchPlan plan = plan_launch(std::move(context));
  DryRunFacts facts;
  facts.attempt = next_attempt(run_dir);
  facts.in_use = run_dir_locked(run_dir);
  facts.succeeded =
      recorded_status(run_dir) == common::kStatusSucceeded && same_work_as_recorded(spec, run_dir);
  facts.fresh = fresh;
  return format_dry_run(plan, facts);
}

}  // namespace dtrain::launcher
