// See dry_run.h. Each task is printed as the launcher would start it: a local task as
// `cd DIR && env VAR=... PROGRAM ARGS`, a task on another host or Slurm node as the remote shell
// or srun command, then what `dtrain agent` runs there (sent on its stdin, never on a command
// line).
#include "launcher/plan/dry_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string_view>

#include "common/cluster_spec.h"
#include "common/control_protocol.h"
#include "common/run_dir.h"
#include "launcher/control/control_server.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/plan/run_preparation.h"
#include "launcher/plan/worker_env.h"
#include "launcher/process/process_start.h"
#include "launcher/process/shell_quote.h"

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
  for (const std::string& word : argv)
    line += (line.empty() ? "" : " ") + shell_word(mask_secrets_in(word));
  return line;
}

// Schemes whose user part is a login name (ssh://git@host), not a credential.
bool user_is_login(std::string_view scheme) {
  for (std::string_view login : {"ssh", "sftp", "scp", "git+ssh", "ssh+git", "rsync"})
    if (scheme.size() == login.size() &&
        std::equal(scheme.begin(), scheme.end(), login.begin(),
                   [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; }))
      return true;
  return false;
}

// The credentials of URLs: the password of scheme://user:password@host, and the whole user part
// of scheme://TOKEN@host (a token passed as the user name), except for login schemes such as ssh.
std::string mask_url_credentials(std::string value) {
  for (size_t at = value.find("://"); at != std::string::npos; at = value.find("://", at + 3)) {
    size_t begin = at;
    while (begin > 0 && (std::isalnum(static_cast<unsigned char>(value[begin - 1])) ||
                         std::string_view("+.-").find(value[begin - 1]) != std::string_view::npos))
      --begin;
    size_t user = at + 3;
    size_t end = std::min(value.find_first_of("/?# \t'\"", user), value.size());
    size_t sign = value.rfind('@', end);
    if (sign == std::string::npos || sign < user || sign == user) continue;
    size_t colon = value.find(':', user);
    if (colon < sign) {
      value.replace(colon + 1, sign - colon - 1, kMaskedValue);
    } else if (!user_is_login(std::string_view(value).substr(begin, at - begin))) {
      value.replace(user, sign - user, kMaskedValue);
    }
  }
  return value;
}

// A NAME=value pair inside a value (a query parameter, a connection string's field, an option)
// is secret when NAME is a secret variable name or, camel-cased, ends in Key, Password,
// Signature or Secret (Azure's AccountKey, SharedAccessKey; sig, pwd).
bool is_secret_field(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::string upper(name);
  for (char& ch : upper)  // api-key and api.key read as API_KEY
    ch = ch == '-' || ch == '.' ? '_'
                                : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (upper.empty()) return false;
  if (is_secret_name(upper)) return true;
  for (std::string_view whole : {"KEY", "SIG", "PWD", "PASSWD"})
    if (upper == whole) return true;
  for (std::string_view tail : {"KEY", "SIGNATURE"}) {
    if (upper.size() > tail.size() &&
        upper.compare(upper.size() - tail.size(), tail.size(), tail.data(), tail.size()) == 0 &&
        std::islower(static_cast<unsigned char>(name[name.size() - tail.size() - 1])) &&
        std::isupper(static_cast<unsigned char>(name[name.size() - tail.size()])))
      return true;  // AccountKey, SharedAccessSignature; not monkey or MONKEY
  }
  return false;
}

// The values of secret NAME=value fields: "?password=x&a=1", "AccountName=a;AccountKey=k==;",
// "--api-key=k". A value runs to the next '&', ';', '#', space or quote.
std::string mask_secret_fields(std::string value) {
  auto name_char = [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
  };
  for (size_t eq = value.find('='); eq != std::string::npos; eq = value.find('=', eq + 1)) {
    size_t name = eq;
    while (name > 0 && name_char(value[name - 1])) --name;
    if (name == eq) continue;
    if (name > 0 && std::string_view("?&; \t,'\"").find(value[name - 1]) == std::string_view::npos)
      continue;
    if (!is_secret_field(std::string_view(value).substr(name, eq - name))) continue;
    size_t end = std::min(value.find_first_of("&;# \t'\"", eq + 1), value.size());
    if (end == eq + 1 || std::string_view(value).substr(eq + 1, end - eq - 1) == kMaskedValue)
      continue;
    value.replace(eq + 1, end - eq - 1, kMaskedValue);
    eq += std::string_view(kMaskedValue).size();
  }
  return value;
}

// "  cd DIR && env \\\n      VAR=value \\\n ...      PROGRAM ARGS\n".
std::string env_command(const std::string& indent, const std::string& cwd,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        const std::vector<std::string>& argv) {
  std::string out = fmt::format("{}cd {} && env \\\n", indent, shell_word(cwd));
  for (const auto& [name, value] : env) {
    std::string shown = is_secret_name(name) ? kMaskedValue : shell_word(mask_secrets_in(value));
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

std::string mask_secrets_in(const std::string& value) {
  return mask_secret_fields(mask_url_credentials(value));
}

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
        "# the run already succeeded: a launch would change nothing (a larger train.epochs "
        "continues it; --fresh trains it again from scratch)\n";
  } else if (!facts.start.empty()) {
    out += fmt::format("# a launch {}\n", facts.start);
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
  if (plan.in_place)
    out += "# recovery: in place (a failed worker is replaced while the others run)\n";
  else if (!plan.recovery_note.empty())
    out += fmt::format("# {}\n", plan.recovery_note);
  out += fmt::format("# secrets are shown as {}\n", kMaskedValue);
  for (const TaskPlan& task : plan.tasks) out += "\n" + format_task(plan, task, facts.attempt);
  return out;
}

std::string dry_run(const common::JobSpec& spec, bool fresh) {
  raise_open_file_limit();  // the ports of "workers": 4096 are picked with all of them held
  std::string root = run_root(spec);
  common::RunDir run_dir(root);
  LaunchContext context = make_launch_context(spec, root);
  context.token = std::string(64, 'x');  // masked in the report; never a real token
  LaunchPlan plan = plan_launch(std::move(context));
  DryRunFacts facts;
  facts.attempt = next_attempt(run_dir);
  facts.in_use = run_dir_locked(run_dir);
  const RunStart start = run_start(spec, run_dir, fresh);
  facts.succeeded = start.kind == RunStart::Kind::kFinished;
  facts.start = start.kind == RunStart::Kind::kRefused ? "would refuse: " + start.what : start.what;
  facts.fresh = fresh;
  return format_dry_run(plan, facts);
}

}  // namespace dtrain::launcher
