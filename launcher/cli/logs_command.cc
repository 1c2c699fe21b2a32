// `dtrain logs`: options, which run directory and which log files, and printing each line with
// its "[worker 1] " prefix (coloured on a terminal). Reading and following the files is
// LogFollower's (log_follower.h), and which lines --since/--grep keep is LogFilter's
// (log_filter.h); this file does no file reading of its own.
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "launcher/cli/commands.h"
#include "launcher/control/run_lookup.h"
#include "launcher/view/console.h"
#include "launcher/view/log_filter.h"
#include "launcher/view/log_follower.h"

namespace dtrain::launcher {
namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;

constexpr size_t kFollowDefaultLines = 10;

struct LogsOptions {
  std::string target;  ///< RUN_DIR or JOB_FILE; "" for the one run under ./runs
  bool follow = false;
  int worker = -1;
  std::string task;
  int lines = -1;  ///< -1: all (10 with --follow, unless --since)
  bool raw = false;
  std::string since;  ///< "" when not given
  std::string grep;
};

/// Sends lines to the console: "[worker 1] line", or bare with --raw.
class PrefixedOutput : public LineSink {
 public:
  explicit PrefixedOutput(bool raw) : raw_(raw), console_(Console::for_stdout()) {}
  void line(const common::TaskId& task, std::string_view text) override {
    console_.print_line(task, text, raw_);
  }
  void flush() override { console_.flush(); }

 private:
  bool raw_;
  Console console_;
};

po::variables_map parse_logs_options(const Args& args, po::options_description& desc,
                                     LogsOptions& o) {
  desc.add_options()("follow,f", po::bool_switch(&o.follow),
                     "keep printing new lines until the run is over")(
      "worker", po::value(&o.worker)->value_name("N"), "only worker N's log")(
      "task", po::value(&o.task)->value_name("TYPE:INDEX"),
      "only this task's log, e.g. chief:0 or evaluator:0")(
      "lines,n", po::value(&o.lines)->value_name("LINES"),
      "the last LINES (matching) lines of each log (default: all; 10 with --follow, unless "
      "--since)")("since", po::value(&o.since)->value_name("TIME"),
                  "only lines from TIME on: a duration before now (90s, 10m, 2h, 1d, 1h30m) or a "
                  "time, 2026-11-25T10:00:00 or \"2026-11-25 10:00:00\", with optional "
                  ".fraction and zone (Z, +01:00; local time without one); a line without a "
                  "time of its own has the time of the timed line before it")(
      "grep", po::value(&o.grep)->value_name("REGEX"),
      "only lines in which the regular expression REGEX (RE2 syntax: grep -E's plus \\d, \\w, "
      "\\s) matches, anywhere in the line as written in the log file (without the prefix)")(
      "raw", po::bool_switch(&o.raw), "print lines without the \"[worker 1] \" prefix")(
      "help,h", "show this help");
  po::options_description all;
  all.add(desc).add_options()("run", po::value(&o.target));
  po::positional_options_description order;
  order.add("run", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(order).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw common::ConfigError(fmt::format("logs: {} (see dtrain logs --help)", e.what()));
  }
  return vm;
}

std::optional<common::TaskId> selected_task(const LogsOptions& o) {
  if (o.worker >= 0 && !o.task.empty()) {
    throw common::ConfigError("logs: give --worker or --task, not both");
  }
  if (!o.task.empty()) return common::parse_task_id(o.task);
  if (o.worker >= 0) return common::TaskId{common::kWorker, o.worker};
  return std::nullopt;
}

/// A selected log file that is missing is an error unless -f can wait for it.
void check_selected_file(const common::RunDir& run, const common::TaskId& task, bool follow) {
  std::error_code ec;
  std::string path = run.log_file(task);
  if (fs::exists(path, ec)) return;
  if (run_is_over(run)) {
    throw common::ConfigError(fmt::format("logs: {}: no such log file (the run is over)", path));
  }
  if (!follow) {
    throw common::ConfigError(
        fmt::format("logs: {}: no such log file yet (-f waits for it)", path));
  }
}

/// Blocks SIGINT and SIGTERM and returns a descriptor that is readable once one arrives, so
/// following ends cleanly after printing what it has read.
common::UniqueFd stop_signal_fd() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  common::UniqueFd fd;
  if (::sigprocmask(SIG_BLOCK, &signals, nullptr) == 0) {
    fd.reset(::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
  }
  if (!fd.valid()) {
    throw common::IoError(fmt::format("logs: cannot watch for SIGINT: {}", std::strerror(errno)));
  }
  return fd;
}

std::optional<size_t> lines_to_show(const LogsOptions& o, const po::variables_map& vm) {
  if (o.lines >= 0) return static_cast<size_t>(o.lines);
  if (o.follow && !vm.count("since")) return kFollowDefaultLines;
  return std::nullopt;
}

LogFilter make_filter(const LogsOptions& o, const po::variables_map& vm) {
  std::optional<WallTime> since;
  if (vm.count("since")) since = parse_since(o.since, std::chrono::system_clock::now());
  std::optional<std::string> grep;
  if (vm.count("grep")) grep = o.grep;
  return LogFilter(since, grep);
}

}  // namespace

int logs_command(const Args& args) {
  LogsOptions o;
  po::options_description desc(
      "Usage: dtrain logs [RUN_DIR|JOB_FILE] [-f] [--worker N | --task TYPE:INDEX] [-n LINES]\n"
      "                   [--since TIME] [--grep REGEX]\n\n"
      "Prints the workers' logs of a run, each line prefixed with its task (\"[worker 1] \").\n"
      "Without RUN_DIR: the only run under ./runs. With -f, keeps printing new lines, also of\n"
      "workers that start later, until the run is over or Ctrl-C. --since and --grep filter\n"
      "printed and followed lines alike; -n counts the lines they keep. See docs/cli.md.\n\n"
      "Options");
  po::variables_map vm = parse_logs_options(args, desc, o);
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (vm.count("lines") && o.lines < 0) throw common::ConfigError("logs: --lines must be >= 0");
  if (vm.count("worker") && o.worker < 0) throw common::ConfigError("logs: --worker must be >= 0");
  LogFilter filter = make_filter(o, vm);
  common::RunDir run(resolve_run_dir(o.target, "logs"));
  std::optional<common::TaskId> only = selected_task(o);
  if (only) check_selected_file(run, *only, o.follow);

  PrefixedOutput output(o.raw);
  LogFollower follower(run, only, output, &filter);
  if (!o.follow) {
    if (follower.print(lines_to_show(o, vm)) == 0) {
      std::cerr << fmt::format("logs: {}: no log files yet\n", run.logs_dir());
    }
    return 0;
  }
  common::UniqueFd stop = stop_signal_fd();
  follower.follow(lines_to_show(o, vm), stop.get());
  return 0;
}

}  // namespace dtrain::launcher
