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
#include "launcher/torch_env.h"

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

std::string where(const LaunchContext& c, const common::TaskId& task) {
  if (c.slurm) return fmt::format("Slurm node {}", c.slurm->tasks.at(task.index).node);
  std::string host = common::parse_host_port(c.cluster.address(task), task.text()).host;
  if (!uses_agent(c, task)) return fmt::format("{} (this machine)", host);
  return fmt::format("{} (over {})", host, c.spec->remote_shell.at(0));
}

std::string format_task(const LaunchContext& c, const common::TaskId& task, int attempt) {
  SpawnRequest request = make_spawn_request(c, task, attempt);
  std::string out =
      fmt::format("{} {} on {}\n", task.text(), c.cluster.address(task), where(c, task));
  if (!request.agent) return out + env_command("  ", request.cwd, request.env, request.argv);
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

std::string format_dry_run(const LaunchContext& c, int attempt, bool in_use) {
  std::string out = fmt::format(
      "# dry run of job \"{}\": {} task(s), run directory {}, attempt {}; nothing was started and "
      "no file was written\n",
      c.spec->job, c.cluster.tasks().size(), c.run_dir, attempt);
  if (in_use) {
    out += "# the run directory is in use by a running launcher: a launch now would refuse\n";
  }
  if (c.master_port > 0) {
    const char* why = c.spec->master_port ? "is the job's"
                      : master_is_local(c)
                          ? "is free now; a launch checks it again and picks another if taken"
                          : "is the first one above the chief's port that no task uses";
    out += fmt::format("# MASTER_PORT {} {}\n", c.master_port, why);
  }
  out += fmt::format("# secrets are shown as {}\n", kMaskedValue);
  for (const common::TaskId& task : c.cluster.tasks()) out += "\n" + format_task(c, task, attempt);
  return out;
}

std::string dry_run(const common::JobSpec& spec) {
  std::string root = run_root(spec);
  common::RunDir run_dir(root);
  LaunchContext context = make_launch_context(spec, root);
  context.token = std::string(64, 'x');  // masked in the report; never a real token
  context.control_address = common::kControlScheme + control_socket_path(root);
  return format_dry_run(context, next_attempt(run_dir), run_dir_locked(run_dir));
}

}  // namespace dtrain::launcher
