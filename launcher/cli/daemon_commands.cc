// `dtrain status` and `dtrain stop`: talk to a run's launcher over its control socket (one JSON
// line each way), and fall back to state.json, saying so, when the launcher is gone.
#include <signal.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/options.h"
#include "launcher/control/control_client.h"
#include "launcher/control/control_server.h"
#include "launcher/control/run_list.h"
#include "launcher/control/run_lookup.h"

namespace dtrain::launcher {
namespace po = boost::program_options;
namespace {

bool alive(int64_t pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

std::string fixed(const common::JsonNode& node, const char* key, const char* format) {
  auto n = node.find(key);
  if (!n || n->is_null()) return "-";
  return fmt::format(fmt::runtime(format), n->as_number(-1e300, 1e300));
}

// Seconds shown as milliseconds: "12.3ms", "-" when absent.
std::string milliseconds(const common::JsonNode& node, const char* key) {
  auto n = node.find(key);
  if (!n || n->is_null()) return "-";
  return fmt::format("{:.1f}ms", n->as_number(0, 1e300) * 1000);
}

// "straggler: worker:1 computes 52.1 ms/step, 4.8x the others' median (10.9 ms); ..."
void print_straggler(const common::JsonNode& s) {
  auto straggler = s.find("straggler");
  if (!straggler) return;
  double slow = straggler->at("compute_seconds_per_step").as_number(0, 1e300);
  double others = straggler->at("others_median_seconds").as_number(0, 1e300);
  std::cout << fmt::format(
      "straggler: {} computes {:.1f} ms/step, {} the others' median ({:.1f} ms); the group runs "
      "at its pace\n",
      straggler->at("task").as_string(), slow * 1000,
      others > 0 ? fmt::format("{:.1f}x", slow / others) : std::string("far over"), others * 1000);
}

void print_human(const common::JsonNode& s, bool daemon) {
  // steps_redone is absent from the state.json of a launcher before issue 24.
  std::optional<common::JsonNode> redone = s.find("steps_redone");
  // generation: absent before issue 26.
  std::optional<common::JsonNode> generation = s.find("generation");
  std::cout << fmt::format(
      "job \"{}\": {}, attempt {}{}, restarts {}, preemptions {}{}\n", s.at("job").as_string(),
      s.at("status").as_string(), s.at("attempt").as_int(0, 1 << 30),
      generation ? fmt::format(", generation {}", generation->as_int(0, 1 << 30)) : std::string(),
      s.at("restarts").as_int(0, 1 << 30), s.at("preemptions").as_int(0, 1 << 30),
      redone ? fmt::format(", steps redone {}", redone->as_int(0, int64_t{1} << 50))
             : std::string());
  int64_t pid = s.at("launcher_pid").as_int(0, 1 << 30);
  std::cout << fmt::format("run directory {}; launcher pid {}: {}; up {:.0f} s (as of {})\n",
                           s.at("run_dir").as_string(), pid, daemon ? "running" : "gone",
                           s.at("uptime_seconds").as_number(0, 1e12),
                           s.at("updated_at").as_string());
  if (auto reason = s.find("reason")) std::cout << "ended: " << reason->as_string() << "\n";
  if (auto size = s.find("world_size")) {  // an elastic job: its size over time
    std::string history;
    if (auto points = s.find("membership")) {
      for (const common::JsonNode& p : points->as_array()) {
        history +=
            fmt::format(" -> {} at {} (generation {})", p.at("world_size").as_int(0, 1 << 30),
                        p.at("at").as_string(), p.at("generation").as_int(0, 1 << 30));
      }
    }
    std::cout << fmt::format("world size {}{}\n", size->as_int(0, 1 << 30),
                             history.empty() ? "" : ":" + history);
  }
  constexpr const char* kRow =
      "{:<12} {:<22} {:>7} {:<11} {:>5} {:>9} {:>8} {:>8} {:>9} {:>10} {:>10} {:>6}\n";
  std::cout << fmt::format(kRow, "task", "address", "pid", "state", "epoch", "step", "loss", "acc",
                           "samples/s", "compute/st", "wait/st", "age");
  for (const common::JsonNode& w : s.at("workers").as_array()) {
    std::string epoch = "-", step = "-", loss = "-", acc = "-", rate = "-", compute = "-",
                wait = "-";
    if (auto p = w.find("last_progress")) {
      epoch = fmt::format("{}/{}", fixed(*p, "epoch", "{:.0f}"), fixed(*p, "epochs", "{:.0f}"));
      step = fmt::format("{}/{}", fixed(*p, "step", "{:.0f}"), fixed(*p, "steps", "{:.0f}"));
      loss = fixed(*p, "loss", "{:.4f}");
      acc = fixed(*p, "accuracy", "{:.4f}");
      rate = fixed(*p, "samples_per_second", "{:.0f}");
      compute = milliseconds(*p, "compute_seconds_per_step");
      wait = milliseconds(*p, "wait_seconds_per_step");
    }
    std::cout << fmt::format(kRow, w.at("task").as_string(), w.at("address").as_string(),
                             w.at("pid").as_int(0, 1 << 30), w.at("state").as_string(), epoch, step,
                             loss, acc, rate, compute, wait,
                             fixed(w, "progress_age_seconds", "{:.1f}s"));
  }
  print_straggler(s);
}

// An optional RUN_DIR|JOB_FILE first, then options.
std::pair<std::string, Args> split_target(const Args& args) {
  if (!args.empty() && !args[0].empty() && args[0][0] != '-')
    return {args[0], Args(args.begin() + 1, args.end())};
  return {"", args};
}

}  // namespace

int status_command(const Args& all_args) {
  auto [target, args] = split_target(all_args);
  bool json = false;
  po::options_description desc(
      "Usage: dtrain status [RUN_DIR|JOB_FILE] [--json]\n\n"
      "Shows a run's state and each worker's progress, from its launcher, or from\n"
      "state.json when the launcher is gone (and says so). With no run named, lists every\n"
      "run under ./runs, one line each.\n\nOptions");
  desc.add_options()("json", po::bool_switch(&json), "print JSON for scripts")("help,h",
                                                                               "show this help");
  po::variables_map vm = parse_options(args, desc, {}, "status");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (target.empty()) {
    std::vector<RunSummary> runs = list_runs("runs");
    if (runs.empty() && !json) {
      std::cout << "no runs under ./runs\n";
      return 0;
    }
    std::cout << (json ? format_run_json(runs) + "\n" : format_run_table(runs));
    return 0;
  }
  std::string run_dir = resolve_run_dir(target, "status");
  auto [text, daemon] = read_state(run_dir);
  common::JsonDocument doc = common::JsonDocument::parse(text, "state");
  if (json) {
    // {"daemon": ..., then every member of the state}, written member by member.
    common::JsonWriter out;
    out.begin_object().key("daemon").value(daemon ? "running" : "gone");
    for (const auto& [key, value] : doc.root().as_object())
      if (key != "daemon") out.key(key).raw(value.dump());
    std::cout << out.end_object().str() << "\n";
    return 0;
  }
  print_human(doc.root(), daemon);
  if (!daemon && !common::is_final_status(doc.root().at("status").as_string())) {
    std::cout << "the launcher is gone without finishing the run (its guardian ended the workers); "
                 "`dtrain launch` on this run directory resumes it\n";
  }
  return 0;
}

int stop_command(const Args& all_args) {
  auto [target, args] = split_target(all_args);
  bool now = false;
  double timeout = 120;
  po::options_description desc(
      "Usage: dtrain stop [RUN_DIR|JOB_FILE] [--now]\n\n"
      "Stops a running launcher: by default the workers save a checkpoint and exit 143,\n"
      "leaving the run resumable with `dtrain launch`; --now kills them at once.\n\nOptions");
  desc.add_options()("now", po::bool_switch(&now),
                     "kill the workers now instead of letting them save")(
      "timeout", po::value(&timeout), "seconds to wait for the launcher to exit (default 120)")(
      "help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {}, "stop");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  std::string run_dir = resolve_run_dir(target, "stop");
  auto [text, daemon] = read_state(run_dir);
  common::JsonDocument doc = common::JsonDocument::parse(text, "state");
  int64_t pid = doc.root().at("launcher_pid").as_int(0, 1 << 30);
  if (!daemon) {
    std::cout << fmt::format("{}: no launcher is running (status: {})\n", run_dir,
                             doc.root().at("status").as_string());
    return 0;
  }
  ask_launcher(run_dir, now ? R"({"request":"stop","now":true})" : R"({"request":"stop"})");
  double deadline = common::monotonic_seconds() + timeout;
  while (alive(pid) && common::monotonic_seconds() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (alive(pid))
    throw common::IoError(fmt::format("launcher pid {} still runs after {:.0f} s", pid, timeout));
  common::JsonDocument final_state =
      common::JsonDocument::parse(common::read_file(common::RunDir(run_dir).state_json()), "state");
  std::cout << fmt::format(
      "{}: {} ({})\n", run_dir, final_state.root().at("status").as_string(),
      final_state.root().find("reason") ? final_state.root().at("reason").as_string() : "");
  return 0;
}

}  // namespace dtrain::launcher
