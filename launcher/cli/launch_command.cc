// `dtrain launch JOB_FILE`: prepares the run directory, then runs the supervisor on one Asio
// loop with the launcher's signals and the control socket, and prints the outcome.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <filesystem>
#include <iostream>
#include <thread>

#include "common/atomic_file.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/job_spec.h"
#include "common/json.h"
#include "common/logging.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/options.h"
#include "launcher/control/control_server.h"
#include "launcher/placement/remote_child.h"
#include "launcher/plan/dry_run.h"
#include "launcher/plan/run_preparation.h"
#include "launcher/plan/train_check.h"
#include "launcher/process/process_start.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/view/console_log_sink.h"
#include "launcher/view/metrics_server.h"

namespace dtrain::launcher {
namespace po = boost::program_options;
namespace {

struct LaunchOptions {
  std::string job_file;
  std::string run_dir;
  bool detach = false;
  bool dry_run = false;
  bool fresh = false;
  int metrics_port = 0;
};

// `dtrain status` and `dtrain stop` requests on the control socket.
std::string answer_request(Supervisor& supervisor, const std::string& request_json) {
  common::JsonDocument doc = common::JsonDocument::parse(request_json, "request");
  std::string kind = doc.root().at("request").as_string();
  if (kind == "status") return state_json(supervisor.snapshot());
  if (kind == "stop") {
    bool now = false;
    if (auto n = doc.root().find("now")) now = n->as_bool();
    spdlog::warn("stop requested{}",
                 now ? " (now: killing the workers)" : ": the workers save and stop");
    supervisor.stop(SIGTERM);
    if (now) supervisor.kill_now();
    return R"({"ok":true})";
  }
  return common::JsonWriter()
      .begin_object()
      .key("ok")
      .value(false)
      .key("error")
      .value(fmt::format("unknown request {}", common::json_quote(kind)))
      .end_object()
      .str();
}

// Becomes a daemon: own session, not a session leader, stdin from /dev/null, stdout and stderr
// appended to launcher.log, pid in launcher.pid. The original process prints the run directory
// and exits 0 (it returns true; the daemon returns false and goes on).
bool detach(const common::RunDir& run_dir) {
  std::fflush(nullptr);
  pid_t first = ::fork();
  if (first < 0) throw common::IoError("fork failed");
  if (first > 0) {
    int status = 0;
    ::waitpid(first, &status, 0);
    std::cout << run_dir.root() << "\n";
    return true;
  }
  ::setsid();
  if (::fork() != 0) ::_exit(0);
  int null_fd = ::open("/dev/null", O_RDONLY);
  std::string log = run_dir.root() + "/launcher.log";
  int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ::dup2(null_fd, STDIN_FILENO);
  ::dup2(log_fd, STDOUT_FILENO);
  ::dup2(log_fd, STDERR_FILENO);
  ::close(null_fd);
  ::close(log_fd);
  common::write_file_atomically(run_dir.root() + "/launcher.pid",
                                std::to_string(::getpid()) + "\n");
  common::setup_logging("launcher");  // again: stderr is a file now, so no colour codes
  return false;
}

// ", after 2 recoveries (1 in place) that redid 386 steps" (the recoveries whose resumed step is
// known).
std::string recovery_cost(const SupervisorResult& result) {
  if (result.recoveries.empty()) return "";
  int64_t redone = 0;
  size_t in_place = 0;
  for (const Recovery& r : result.recoveries) {
    redone += r.steps_redone();
    in_place += r.in_place ? 1 : 0;
  }
  size_t n = result.recoveries.size();
  return fmt::format(", after {} {}{} that redid {} step{}", n, n == 1 ? "recovery" : "recoveries",
                     in_place > 0 ? fmt::format(" ({} in place)", in_place) : std::string(), redone,
                     redone == 1 ? "" : "s");
}

void print_summary(const common::JobSpec& spec, const common::RunDir& run_dir,
                   const SupervisorResult& result, int attempt) {
  if (result.status == common::kStatusSucceeded) {
    std::cerr << fmt::format("dtrain: job \"{}\" succeeded on attempt {}{}\n", spec.job, attempt,
                             recovery_cost(result));
    if (std::filesystem::exists(run_dir.model_dir()))
      std::cerr << fmt::format("dtrain: model: {}\n", run_dir.model_dir());
    if (std::filesystem::exists(run_dir.metrics_jsonl()))
      std::cerr << fmt::format("dtrain: metrics: {}\n", run_dir.metrics_jsonl());
    std::cerr << fmt::format("dtrain: logs: {} (dtrain logs {})\n", run_dir.logs_dir(),
                             run_dir.root());
    return;
  }
  if (result.status == common::kStatusStopped) {
    std::cerr << fmt::format(
        "dtrain: job \"{}\" stopped on attempt {} ({}); `dtrain launch` again "
        "resumes it\n",
        spec.job, attempt, result.reason);
    return;
  }
  std::cerr << fmt::format("dtrain: job \"{}\" failed: {}\n", spec.job, result.reason);
  if (!result.failure) return;
  const FailureReport& f = *result.failure;
  std::cerr << fmt::format("dtrain: first failure: {} {} ({}) on attempt {}\n", f.task.text(),
                           outcome_name(f.outcome), f.what, f.attempt);
  // The lines the launcher saw, which a full disk may have kept out of the log file.
  const std::vector<std::string> lines =
      f.last_lines.empty() ? tail_lines(f.log_path, 20) : f.last_lines;
  std::cerr << fmt::format("dtrain: last lines of {}:\n", f.log_path);
  for (const std::string& line : lines) std::cerr << "  " << line << "\n";
}

int run_supervisor(const common::JobSpec& spec, PreparedRun& run,
                   common::UniqueFd metrics_listener) {
  boost::asio::io_context io;
  GroupGuardian guardian = GroupGuardian::start();
  auto local_spawner = make_local_spawner(io);
  auto spawner = make_agent_spawner(io, *local_spawner);
  RunRecorder recorder(run.run_dir);
  Console console = Console::for_stdout();
  ConsoleLogRoute log_route(console);  // log lines around the live line, not glued to it
  std::unique_ptr<Supervisor> supervisor;
  ControlLimits limits;  // room for every worker's connection besides clients
  limits.max_connections = std::max<size_t>(limits.max_connections, 2 * run.plan.tasks.size() + 64);
  ControlServer control(
      io, control_socket_path(run.plan.context.run_dir),
      [&](const common::ControlMessage& m) { supervisor->on_control_message(m); },
      [&](const std::string& request) { return answer_request(*supervisor, request); }, limits);
  // A worker's reform request waits for the supervisor's decision
  // (docs/design.md#in-place-recovery).
  control.defer("spare", [&](const std::string& request, ControlServer::Reply reply) {
    supervisor->on_spare_request(request, std::move(reply));
  });
  control.defer("reform", [&](const std::string& request, ControlServer::Reply reply) {
    supervisor->on_reform_request(request, std::move(reply));
  });
  // A worker's SIGTERM from elsewhere: the job's stop, or its own preemption?
  control.defer("sigterm", [&](const std::string& request, ControlServer::Reply reply) {
    supervisor->on_sigterm_query(request, std::move(reply));
  });
  // Only the process started for a task speaks for it (docs/control.md).
  control.check_senders([&](const std::string& kind, const std::string& task, int pid) {
    return supervisor->sender_refusal(kind, task, pid);
  });
  DT_ENFORCE_EQ(control.address(), run.plan.context.control_address,
                "the control socket is not where the plan told the workers");
  supervisor = std::make_unique<Supervisor>(
      io, *spawner, recorder, console, &guardian,
      SupervisorOptions{std::move(run.plan), run.first_attempt, static_cast<uint64_t>(::getpid())});
  std::unique_ptr<MetricsServer> metrics;
  if (metrics_listener.valid()) {
    metrics = std::make_unique<MetricsServer>(
        io, std::move(metrics_listener), [&] { return prometheus_text(supervisor->snapshot()); });
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  int signals_seen = 0;
  std::function<void()> wait_signal = [&] {
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      if (++signals_seen == 1) {
        spdlog::warn(
            "got {}: stopping the workers (SIGTERM, {} s grace); Ctrl-C again kills them now",
            signal_name(sig), spec.restart.grace_seconds);
        supervisor->stop(sig);
      } else if (sig == SIGINT) {
        spdlog::warn("second SIGINT: killing the workers now");
        supervisor->kill_now();
      }
      wait_signal();
    });
  };
  wait_signal();
  SupervisorResult result;
  supervisor->start([&](const SupervisorResult& r) {
    result = r;
    io.stop();
  });
  io.run();
  console.finish();
  print_summary(spec, run.run_dir, result, supervisor->attempt());
  return result.exit_code;
}

}  // namespace

int launch_command(const Args& args) {
  LaunchOptions options;
  po::options_description desc(
      "Usage: dtrain launch JOB_FILE [--run-dir DIR] [--detach] [--metrics-port PORT] "
      "[--dry-run] [--fresh]\n\n"
      "Starts every task of the job with its TF_CONFIG, keeps one log per worker in RUN_DIR/logs,\n"
      "shows them merged, and restarts the whole group when a worker fails or is preempted.\n"
      "Launching again on a stopped run directory resumes it; on one that succeeded it does\n"
      "nothing, continues it when train.epochs grew, and refuses other changes unless --fresh\n"
      "is given.\n\nOptions");
  desc.add_options()("run-dir", po::value(&options.run_dir),
                     "run directory (default: the job's run_dir)")(
      "detach", po::bool_switch(&options.detach),
      "run as a daemon: print the run directory and return at once")(
      "metrics-port", po::value(&options.metrics_port),
      "serve Prometheus metrics on 127.0.0.1:PORT (1-65535)")(
      "dry-run", po::bool_switch(&options.dry_run),
      "print each task's command and environment (secrets masked); start nothing, write nothing")(
      "fresh", po::bool_switch(&options.fresh),
      "train from scratch: remove the run's model, metrics, TensorBoard files and checkpoints "
      "first (a run that succeeded is otherwise left as it is)")("help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {{"job-file", &options.job_file}}, "launch");
  if (vm.count("help")) {
    std::cout << desc;
    return common::kExitSuccess;
  }
  common::setup_logging("launcher");
  common::JobSpec spec = common::load_job_spec(options.job_file);
  check_train_section(spec);
  if (!options.run_dir.empty()) spec.run_dir = options.run_dir;
  if (options.dry_run) {
    if (options.detach) throw common::ConfigError("launch: give --dry-run or --detach, not both");
    std::cout << dry_run(spec, options.fresh);
    return common::kExitSuccess;
  }
  common::RunDir existing(run_root(spec));
  const RunStart start = run_start(spec, existing, options.fresh);
  if (start.kind == RunStart::Kind::kFinished) {
    std::cerr << fmt::format(
        "dtrain: job \"{}\" already succeeded in {}: nothing to do (its model and metrics are "
        "kept; a larger train.epochs continues it; `dtrain launch {} --fresh` trains it again "
        "from scratch)\n",
        spec.job, existing.root(), options.job_file);
    return common::kExitSuccess;
  }
  if (start.kind == RunStart::Kind::kRefused)
    throw common::ConfigError(fmt::format("{}: {}", options.job_file, start.what));
  ::signal(SIGPIPE, SIG_IGN);
  raise_open_file_limit();  // about two descriptors per worker
  // Bound before detaching, so that a port in use fails this command (exit 2), not the daemon.
  common::UniqueFd metrics_listener;
  if (vm.count("metrics-port")) metrics_listener = listen_for_metrics(options.metrics_port);
  PreparedRun run = prepare_run(spec, options.fresh);
  if (options.detach && detach(run.run_dir)) return common::kExitSuccess;
  spdlog::info("job \"{}\": {} task(s), run directory {}, attempt {}; it {}", spec.job,
               run.plan.tasks.size(), run.plan.context.run_dir, run.first_attempt, start.what);
  if (!run.plan.recovery_note.empty()) spdlog::info("{}", run.plan.recovery_note);
  return run_supervisor(spec, run, std::move(metrics_listener));
}

}  // namespace dtrain::launcher
