// See slurm.h.
#include "launcher/placement/slurm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "common/env_vars.h"
#include "common/errors.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/process/captured_run.h"
#include "launcher/process/shell_quote.h"

namespace dtrain::launcher {
namespace {

constexpr double kScontrolSeconds = 20;
constexpr size_t kMaxHosts = 65536;
/// Bracket groups in one host expression: Slurm's own lists use one per dimension (at most 5);
/// the bound keeps a hostile list from recursing deep enough to overflow the stack.
constexpr int kMaxBracketGroups = 16;

bool is_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(),
                                      [](char c) { return std::isdigit((unsigned char)c); });
}

// Splits at commas outside brackets.
std::vector<std::string_view> split_top_level(std::string_view list, const std::string& what) {
  std::vector<std::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw common::ConfigError(fmt::format("{}: unmatched ']'", what));
    if (c == ',' && depth == 0) {
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) throw common::ConfigError(fmt::format("{}: unmatched '['", what));
  return items;
}

// "1-3,07" -> {"1","2","3","07"}: numbers keep the width of the range's first bound.
std::vector<std::string> expand_ranges(std::string_view ranges, const std::string& what) {
  std::vector<std::string> out;
  for (std::string_view range : split_top_level(ranges, what)) {
    size_t dash = range.find('-');
    std::string_view low = range.substr(0, dash);
    std::string_view high = dash == std::string_view::npos ? low : range.substr(dash + 1);
    if (!is_digits(low) || !is_digits(high) || low.size() > 9 || high.size() > 9) {
      throw common::ConfigError(
          fmt::format("{}: \"{}\" is not a number or a range like 1-4", what, range));
    }
    long first = std::stol(std::string(low)), last = std::stol(std::string(high));
    if (last < first || static_cast<size_t>(last - first) >= kMaxHosts) {
      throw common::ConfigError(fmt::format("{}: bad range \"{}\"", what, range));
    }
    for (long n = first; n <= last; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < low.size()) digits.insert(0, low.size() - digits.size(), '0');
      out.push_back(digits);
    }
  }
  return out;
}

// One host expression: a prefix, then bracket groups and text, e.g. "rack[1-2]-n[01-02]".
void expand_item(std::string_view item, const std::string& prefix, const std::string& what,
                 std::vector<std::string>& out, int depth = 0) {
  if (depth > kMaxBracketGroups) {
    throw common::ConfigError(
        fmt::format("{}: more than {} bracket groups in one host name", what, kMaxBracketGroups));
  }
  size_t open = item.find('[');
  if (open == std::string_view::npos) {
    out.push_back(prefix + std::string(item));
    return;
  }
  size_t close = item.find(']', open);
  if (close == std::string_view::npos)
    throw common::ConfigError(fmt::format("{}: unmatched '['", what));
  std::string head = prefix + std::string(item.substr(0, open));
  for (const std::string& number : expand_ranges(item.substr(open + 1, close - open - 1), what)) {
    expand_item(item.substr(close + 1), head + number, what, out, depth + 1);
    if (out.size() > kMaxHosts)
      throw common::ConfigError(fmt::format("{}: more than {} hosts", what, kMaxHosts));
  }
}

std::string required(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (std::optional<std::string> value = env(name); value && !value->empty()) return *value;
  }
  throw common::ConfigError(
      fmt::format("\"cluster\": \"slurm\" needs a Slurm allocation, but {} is not set: submit the "
                  "job with sbatch (`dtrain slurm-script` writes a script) or run `dtrain launch` "
                  "inside salloc",
                  *names.begin()));
}

std::optional<int> optional_count(const EnvLookup& env, const char* name) {
  std::optional<std::string> value = env(name);
  if (!value || value->empty()) return std::nullopt;
  if (!is_digits(*value) || value->size() > 6)
    throw common::ConfigError(fmt::format("{}=\"{}\" is not a count", name, *value));
  return std::stoi(*value);
}

std::string format_address(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// `scontrol -o` words: "Key=value" separated by spaces (a value with spaces is cut at the first).
std::map<std::string, std::string> fields_of(std::string_view line) {
  std::map<std::string, std::string> fields;
  for (size_t pos = 0; pos < line.size();) {
    size_t space = std::min(line.find(' ', pos), line.size());
    std::string_view token = line.substr(pos, space - pos);
    pos = space + 1;
    size_t equals = token.find('=');
    if (equals != std::string_view::npos && equals > 0)
      fields.emplace(token.substr(0, equals), token.substr(equals + 1));
  }
  return fields;
}

}  // namespace

common::ClusterSpec SlurmAllocation::cluster() const {
  std::vector<std::string> addresses;
  for (const SlurmTask& task : tasks) addresses.push_back(task.address);
  return common::ClusterSpec({{common::kWorker, addresses}});
}

std::vector<std::string> expand_hostlist(std::string_view list, const std::string& what) {
  std::vector<std::string> hosts;
  for (std::string_view item : split_top_level(list, what)) {
    if (item.empty()) throw common::ConfigError(fmt::format("{}: empty host name", what));
    expand_item(item, "", what, hosts);
  }
  return hosts;
}

std::vector<int> parse_per_node_counts(std::string_view text, size_t nodes,
                                       const std::string& what) {
  std::vector<int> counts;
  for (std::string_view item : split_top_level(text, what)) {
    size_t paren = item.find("(x");
    std::string_view count = item.substr(0, paren), repeat = "1";
    if (paren != std::string_view::npos) {
      if (item.back() != ')')
        throw common::ConfigError(fmt::format("{}=\"{}\": expected N or N(xM)", what, text));
      repeat = item.substr(paren + 2, item.size() - paren - 3);
    }
    if (!is_digits(count) || !is_digits(repeat) || count.size() > 6 || repeat.size() > 6)
      throw common::ConfigError(fmt::format("{}=\"{}\": expected N or N(xM)", what, text));
    for (int i = 0; i < std::stoi(std::string(repeat)) && counts.size() <= nodes; ++i)
      counts.push_back(std::stoi(std::string(count)));
  }
  if (counts.size() != nodes) {
    throw common::ConfigError(
        fmt::format("{}=\"{}\" does not give one count for each of the {} "
                    "node(s) of the allocation",
                    what, text, nodes));
  }
  return counts;
}

std::map<std::string, std::string> parse_node_addresses(std::string_view output) {
  std::map<std::string, std::string> addresses;
  for (std::string_view line : lines_of(output)) {
    std::map<std::string, std::string> fields = fields_of(line);
    const std::string& name = fields["NodeName"];
    if (!name.empty()) addresses[name] = fields["NodeAddr"].empty() ? name : fields["NodeAddr"];
  }
  return addresses;
}

std::string node_leaving_state(std::string_view output, const std::string& node) {
  static constexpr std::string_view kLeaving[] = {
      "DOWN",          "DRAIN",         "DRAINED",        "DRAINING",
      "FAIL",          "FAILING",       "NOT_RESPONDING", "REBOOT_REQUESTED",
      "REBOOT_ISSUED", "POWERING_DOWN", "POWERED_DOWN",   "POWER_DOWN"};
  for (std::string_view line : lines_of(output)) {
    std::map<std::string, std::string> fields = fields_of(line);
    if (fields["NodeName"] != node) continue;
    const std::string& state = fields["State"];
    size_t start = 0;
    while (start <= state.size()) {
      size_t plus = std::min(state.find('+', start), state.size());
      std::string_view flag = std::string_view(state).substr(start, plus - start);
      // A suffix marks a flag: '*' not responding, '~' powered off, '#' powering up, ...
      bool marked = !flag.empty() && (flag.back() == '*' || flag.back() == '~');
      while (!flag.empty() && !std::isalpha(static_cast<unsigned char>(flag.back())))
        flag.remove_suffix(1);
      if (marked || std::find(std::begin(kLeaving), std::end(kLeaving), flag) != std::end(kLeaving))
        return state;
      start = plus + 1;
    }
    return "";
  }
  return "not listed";
}

int default_port_base(const std::string& job_id) {
  unsigned long long id = 0;
  for (char c : job_id) {
    if (!std::isdigit(static_cast<unsigned char>(c))) break;  // "123_4" (array): the digits first
    id = (id * 10 + static_cast<unsigned>(c - '0')) % 1000000007ULL;
  }
  return 20000 + 64 * static_cast<int>(id % 190);
}

SlurmAllocation read_slurm_allocation(const common::JobSpec& spec, const EnvLookup& env,
                                      const CommandRunner& run) {
  SlurmAllocation allocation;
  allocation.job_id = required(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  std::string nodelist = required(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  std::vector<std::string> nodes = expand_hostlist(nodelist, "SLURM_JOB_NODELIST");
  std::vector<int> tasks = parse_per_node_counts(required(env, {"SLURM_TASKS_PER_NODE"}),
                                                 nodes.size(), "SLURM_TASKS_PER_NODE");
  std::optional<std::string> cpus_text = env("SLURM_JOB_CPUS_PER_NODE");
  std::vector<int> cpus_per_node =
      cpus_text && !cpus_text->empty()
          ? parse_per_node_counts(*cpus_text, nodes.size(), "SLURM_JOB_CPUS_PER_NODE")
          : std::vector<int>(nodes.size(), 0);
  std::optional<int> cpus_per_task = optional_count(env, "SLURM_CPUS_PER_TASK");
  if (spec.slurm_options.cpus_per_task > 0) cpus_per_task = spec.slurm_options.cpus_per_task;
  // GPUs per task as TensorFlow's SlurmClusterResolver reckons them: asked per task, else the
  // node's GPUs shared out among its tasks.
  std::optional<int> gpus_per_task = optional_count(env, "SLURM_GPUS_PER_TASK");
  std::optional<int> gpus_on_node = optional_count(env, "SLURM_GPUS_ON_NODE");
  if (spec.slurm_options.gpus_per_task > 0) gpus_per_task = spec.slurm_options.gpus_per_task;

  std::map<std::string, std::string> addresses =
      parse_node_addresses(run({"scontrol", "-o", "show", "node", nodelist}));
  int base = spec.slurm_options.port_base.value_or(default_port_base(allocation.job_id));
  for (size_t n = 0; n < nodes.size(); ++n) {
    auto found = addresses.find(nodes[n]);
    if (found == addresses.end()) {
      throw common::ConfigError(
          fmt::format("`scontrol show node {}` did not list node {} of "
                      "SLURM_JOB_NODELIST",
                      nodelist, nodes[n]));
    }
    for (int t = 0; t < tasks[n]; ++t) {
      int port = base + static_cast<int>(allocation.tasks.size());
      if (port > 65535) {
        throw common::ConfigError(fmt::format("slurm.port_base: {} + {} tasks passes port 65535",
                                              base, allocation.tasks.size()));
      }
      SlurmTask task;
      task.node = nodes[n];
      task.address = format_address(found->second, port);
      task.cpus = cpus_per_task.value_or(std::max(1, cpus_per_node[n] / std::max(1, tasks[n])));
      task.gpus = gpus_per_task.value_or(gpus_on_node.value_or(0) / std::max(1, tasks[n]));
      allocation.tasks.push_back(task);
    }
  }
  if (allocation.tasks.empty()) {
    throw common::ConfigError(fmt::format(
        "the Slurm allocation {} has no tasks (SLURM_TASKS_PER_NODE)", allocation.job_id));
  }
  return allocation;
}

SlurmAllocation read_slurm_allocation(const common::JobSpec& spec) {
  return read_slurm_allocation(
      spec,
      [](const char* name) -> std::optional<std::string> {
        const char* value = std::getenv(name);
        return value ? std::optional<std::string>(value) : std::nullopt;
      },
      [](const std::vector<std::string>& argv) { return run_and_capture(argv, kScontrolSeconds); });
}

std::string run_and_capture(const std::vector<std::string>& argv, double timeout_seconds) {
  CapturedRun run = run_captured(argv, {}, timeout_seconds);
  if (run.exit_code != 0)
    throw common::IoError(fmt::format("{} failed ({}): {}", run.command, run.ending(), run.err));
  return run.out;
}

std::vector<std::string> node_state_argv(const std::string& node) {
  return {"scontrol", "-o", "show", "node", node};
}

std::vector<std::string> srun_argv(const common::JobSpec& spec, const SlurmAllocation& allocation,
                                   size_t index, const std::string& dtrain_program) {
  const SlurmTask& task = allocation.tasks.at(index);
  std::vector<std::string> argv = spec.slurm_options.srun;
  for (std::string arg :
       {std::string("--nodes=1"), std::string("--ntasks=1"), "--nodelist=" + task.node,
        std::string("--exact"), fmt::format("--cpus-per-task={}", task.cpus),
        fmt::format("--job-name={}-worker-{}", spec.job, index), std::string("--quiet"),
        std::string("--kill-on-bad-exit=1")}) {
    argv.push_back(arg);
  }
  if (task.gpus > 0) argv.push_back(fmt::format("--gres=gpu:{}", task.gpus));
  for (std::string arg :
       {dtrain_program, std::string("agent"), std::string("--keepalive"),
        fmt::format("{:g}", kAgentKeepaliveSeconds), std::string("--signal-grace"),
        fmt::format("{:g}", spec.restart.grace_seconds)}) {
    argv.push_back(arg);
  }
  return argv;
}

std::string slurm_script(const common::JobSpec& spec, const std::string& job_file,
                         const std::string& dtrain_program, const std::string& cwd) {
  const common::SlurmOptions& s = spec.slurm_options;
  int lead =
      static_cast<int>(std::ceil(s.signal_lead_seconds.value_or(spec.restart.grace_seconds + 60)));
  std::string out = "#!/bin/bash\n";
  out += fmt::format("# The Slurm batch script of dtrain job \"{}\" (`dtrain slurm-script`).\n",
                     spec.job);
  out += fmt::format("# {} worker(s): {} node(s) x {} task(s), one task per worker.\n",
                     s.nodes * s.tasks_per_node, s.nodes, s.tasks_per_node);
  auto option = [&out](const std::string& text) { out += "#SBATCH " + text + "\n"; };
  option("--job-name=" + spec.job);
  option(fmt::format("--nodes={}", s.nodes));
  option(fmt::format("--ntasks-per-node={}", s.tasks_per_node));
  if (s.cpus_per_task > 0) option(fmt::format("--cpus-per-task={}", s.cpus_per_task));
  if (s.gpus_per_task > 0) option(fmt::format("--gpus-per-task={}", s.gpus_per_task));
  if (!s.time.empty()) option("--time=" + s.time);
  if (!s.partition.empty()) option("--partition=" + s.partition);
  option("--requeue");
  option(fmt::format("--signal=TERM@{}", lead));
  option("--open-mode=append");
  option("--chdir=" + cwd);
  option(fmt::format("--output={}/{}-%j.out", cwd, spec.job));
  for (const std::string& extra : s.sbatch) option(extra);
  out += fmt::format(
      "\n# {lead} s before the time limit (or on `scancel --signal=TERM`) Slurm sends SIGTERM to "
      "the\n"
      "# workers' steps: they agree on a step, save a checkpoint and exit 143, the launcher exits\n"
      "# 143, and this script puts the job back in the queue; the next run resumes from the\n"
      "# checkpoint in the run directory. SIGTERM to this script too means `scancel` or a\n"
      "# preemption: the launcher still stops the workers gracefully, but the job is not requeued\n"
      "# from here (a cancel is final; Slurm requeues a preempted job itself if so configured).\n"
      "trap 'cancelled=1; echo \"dtrain: the batch script got SIGTERM; waiting for the "
      "launcher\"' TERM\n"
      "{dtrain} launch {job}\n"
      "code=$?\n"
      "if [ \"$code\" -eq 143 ] && [ -z \"${{cancelled:-}}\" ]; then\n"
      "  echo \"dtrain: preempted; requeueing job $SLURM_JOB_ID (restart "
      "${{SLURM_RESTART_COUNT:-0}})\"\n"
      "  scontrol requeue \"$SLURM_JOB_ID\"\n"
      "fi\n"
      "exit \"$code\"\n",
      fmt::arg("lead", lead), fmt::arg("dtrain", shell_quote(dtrain_program)),
      fmt::arg("job", shell_quote(job_file)));
  return out;
}

}  // namespace dtrain::launcher
