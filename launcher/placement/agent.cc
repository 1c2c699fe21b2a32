// See agent.h. The loop watches: the signalfd, stdin (commands), the worker's output pipe, stdout
// (when bytes wait), and the control socket; each pass also checks whether the worker ended,
// whether a watch event is due (every 0.5 s until it ended) and whether a teardown deadline
// passed. poll() never waits longer than 1 s, nor past the next watch event.
#include "launcher/placement/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>

#include "common/clock.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/progress_record.h"
#include "launcher/placement/agent_child.h"
#include "launcher/placement/agent_control.h"
#include "launcher/placement/agent_output.h"
#include "launcher/process/freeze_watch.h"

namespace dtrain::launcher {
namespace {

constexpr double kGiveUpOutputSeconds = 1.0;  ///< after SIGKILL: stop waiting for output EOF
constexpr double kLastFlushSeconds = 0.5;     ///< then: stop waiting for stdout to drain
constexpr size_t kMaxReadyBytes = 4 << 20;    ///< stop reading the worker while this much waits
constexpr int kMaxPollMs = 1000;
constexpr double kWatchSeconds = 0.5;  ///< a watch event this often while the worker runs

void warn(const std::string& message) {
  std::string line = "dtrain agent: " + message + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

// Blocks the signals the loop handles and reads them from a signalfd; restores on destruction.
class SignalFd {
 public:
  SignalFd() {
    sigset_t set;
    ::sigemptyset(&set);
    for (int sig : {SIGCHLD, SIGHUP, SIGINT, SIGTERM}) ::sigaddset(&set, sig);
    ::sigprocmask(SIG_BLOCK, &set, &old_mask_);
    old_pipe_ = ::signal(SIGPIPE, SIG_IGN);
    fd_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!fd_.valid())
      throw common::IoError(fmt::format("agent: signalfd: {}", std::strerror(errno)));
  }
  ~SignalFd() {
    fd_.reset();
    ::signal(SIGPIPE, old_pipe_);
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SignalFd(const SignalFd&) = delete;
  SignalFd& operator=(const SignalFd&) = delete;

  int fd() const { return fd_.get(); }
  /// The first stopping signal (SIGHUP, SIGINT, SIGTERM) read, or 0 (SIGCHLD only, or none).
  int read_stop_signal() {
    int stop = 0;
    signalfd_siginfo info{};
    while (::read(fd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      if (info.ssi_signo != SIGCHLD && stop == 0) stop = static_cast<int>(info.ssi_signo);
    }
    return stop;
  }

 private:
  common::UniqueFd fd_;
  sigset_t old_mask_{};
  sighandler_t old_pipe_ = SIG_DFL;
};

// Sets O_NONBLOCK on a descriptor and puts the old flags back on destruction.
class NonBlocking {
 public:
  explicit NonBlocking(int fd) : fd_(fd), flags_(::fcntl(fd, F_GETFL)) {
    if (flags_ >= 0) ::fcntl(fd_, F_SETFL, flags_ | O_NONBLOCK);
  }
  ~NonBlocking() {
    if (flags_ >= 0) ::fcntl(fd_, F_SETFL, flags_);
  }
  NonBlocking(const NonBlocking&) = delete;
  NonBlocking& operator=(const NonBlocking&) = delete;

 private:
  int fd_;
  int flags_;
};

int ms_until(double deadline) {
  double left = std::ceil((deadline - common::monotonic_seconds()) * 1000);
  return static_cast<int>(std::clamp(left, 0.0, static_cast<double>(kMaxPollMs)));
}

struct RequestLine {
  std::string line;  ///< without its newline
  std::string rest;  ///< bytes after it: the first commands
};

// The first stdin line, within seconds. Throws ConfigError (missing, overlong, too late).
RequestLine read_request_line(int in_fd, SignalFd& signals, double seconds) {
  const std::string expected =
      "(expected one line {\"argv\": [...], \"env\": [...], \"cwd\": ...})";
  double deadline = common::monotonic_seconds() + seconds;
  std::string buffer;
  while (true) {
    if (size_t nl = buffer.find('\n'); nl != std::string::npos)
      return {buffer.substr(0, nl), buffer.substr(nl + 1)};
    if (buffer.size() > kMaxAgentLine) {
      throw common::ConfigError(
          fmt::format("agent: the request line is longer than {} bytes", kMaxAgentLine));
    }
    if (common::monotonic_seconds() >= deadline) {
      throw common::ConfigError(
          fmt::format("agent: no request on stdin within {:g} s {}", seconds, expected));
    }
    pollfd fds[2] = {{in_fd, POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    if (::poll(fds, 2, ms_until(deadline)) <= 0) continue;
    if (int sig = signals.read_stop_signal())
      throw common::IoError(fmt::format("agent: stopped by signal {} before a request came", sig));
    if (fds[0].revents == 0) continue;
    char chunk[64 * 1024];
    ssize_t n = ::read(in_fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw common::ConfigError(fmt::format("agent: stdin {} before a whole request line came {}",
                                            n == 0 ? "closed" : "failed", expected));
    }
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

class Agent {
 public:
  /// progress_path: the worker's DTRAIN_PROGRESS_FILE, when the request asked for one.
  Agent(int in_fd, int out_fd, const AgentOptions& options, SignalFd& signals,
        AgentControlSocket& control, std::unique_ptr<AgentChild> child, std::string commands,
        std::optional<std::string> progress_path)
      : in_fd_(in_fd),
        out_fd_(out_fd),
        options_(options),
        signals_(signals),
        control_(control),
        child_(std::move(child)),
        output_(kMaxAgentLine),
        commands_(std::move(commands)),
        progress_path_(std::move(progress_path)) {
    control_handlers_.message = [this](std::string_view json) {
      output_.add_marked(kControlMarker, json);
    };
    control_handlers_.request = [this](uint64_t id, std::string_view json) {
      output_.add_marked(kRequestMarker, format_relayed_request({id, std::string(json)}));
    };
  }

  int run() {
    output_.add_marked(kEventMarker, format_agent_started_event(child_->pid()));
    handle_commands();
    while (!done()) poll_once();
    if (!status_) warn("the worker did not end after SIGKILL; leaving it");
    return status_ ? status_->shell_code() : 128 + SIGKILL;
  }

 private:
  bool output_open() const { return child_->output_fd() >= 0; }

  bool done() const {
    double now = common::monotonic_seconds();
    if (terminating_ && now >= last_flush_at_) return true;
    if (!status_ || output_open()) return false;
    return stdout_broken_ || output_.ready_size() == 0;
  }

  void poll_once() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    auto watch = [&fds](bool on, int fd, short events) {
      if (!on) return -1;
      fds.push_back({fd, events, 0});
      return static_cast<int>(fds.size() - 1);
    };
    int in = watch(stdin_open_, in_fd_, POLLIN);
    int worker =
        watch(output_open() && output_.ready_size() < kMaxReadyBytes, child_->output_fd(), POLLIN);
    int out = watch(output_.ready_size() > 0, out_fd_, POLLOUT);
    size_t control_first = fds.size();
    size_t control_count = control_.add_poll_fds(fds);
    int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    if (ready > 0) {
      if (fds[0].revents != 0) on_signals();
      if (in >= 0 && fds[in].revents != 0) on_stdin();
      if (worker >= 0 && fds[worker].revents != 0) on_worker_output();
      if (out >= 0 && fds[out].revents != 0) on_stdout();
      control_.handle(&fds[control_first], control_count, control_handlers_);
    }
    check_worker();
    check_watch();
    check_deadlines();
    if (stdout_broken_) output_.ready().clear();
  }

  int poll_timeout_ms() const {
    int ms = kMaxPollMs;
    if (terminating_)
      ms = ms_until(!killed_ ? kill_at_ : output_open() ? give_up_at_ : last_flush_at_);
    if (!status_) ms = std::min(ms, ms_until(next_watch_at_));
    return ms;
  }

  // Someone other than the launcher (Slurm ending the step, a host shutting down) signalled the
  // agent: pass it on, tell the launcher, and give the worker the grace to save.
  void on_signals() {
    int sig = signals_.read_stop_signal();
    if (sig == 0 || terminating_) return;
    output_.add_marked(kEventMarker, format_agent_signaled_event(sig));
    begin_teardown(fmt::format("signal {}", sig), sig, options_.signal_grace_seconds);
  }

  void on_stdin() {
    char chunk[64 * 1024];
    ssize_t n = ::read(in_fd_, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      stdin_open_ = false;
      return begin_teardown("end of stdin", SIGTERM, options_.kill_after_seconds);
    }
    last_input_at_ = common::monotonic_seconds();
    commands_.append(chunk, static_cast<size_t>(n));
    handle_commands();
  }

  void handle_commands() {
    size_t start = 0;
    for (size_t end; (end = commands_.find('\n', start)) != std::string::npos; start = end + 1) {
      std::string_view line(commands_.data() + start, end - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      try {
        run_command(parse_agent_command(line));
      } catch (const common::ConfigError& e) {
        warn(fmt::format("ignored a command: {}", e.what()));
      }
    }
    commands_.erase(0, start);
    if (commands_.size() > kMaxAgentLine) {
      warn(fmt::format("ignored a command line longer than {} bytes", kMaxAgentLine));
      commands_.clear();
    }
  }

  void run_command(const AgentCommand& command) {
    switch (command.kind) {
      case AgentCommand::Kind::kSignal:
        return child_->signal_group(command.signal);
      case AgentCommand::Kind::kQueueSignal:
        return child_->queue_signal(command.signal, command.value);
      case AgentCommand::Kind::kReply:
        control_.reply(command.id, command.line);  // a connection gone meanwhile: dropped
        return;
    }
  }

  void on_worker_output() {
    char chunk[64 * 1024];
    ssize_t n = ::read(child_->output_fd(), chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n > 0) return output_.feed(std::string_view(chunk, static_cast<size_t>(n)));
    close_worker_output();
  }

  void close_worker_output() {
    child_->close_output();
    output_.finish();
  }

  void on_stdout() {
    std::string& ready = output_.ready();
    ssize_t n = ::write(out_fd_, ready.data(), ready.size());
    if (n > 0) {
      ready.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      stdout_broken_ = true;  // the launcher's end is gone
      begin_teardown(fmt::format("stdout: {}", std::strerror(errno)), SIGTERM,
                     options_.kill_after_seconds);
    }
  }

  void check_worker() {
    if (status_) return;
    status_ = child_->poll_exit();
    if (status_) output_.add_marked(kEventMarker, format_agent_exit_event(*status_));
  }

  // The agent's sign of life and the launcher's freeze watch of a remote worker: its /proc state
  // and progress record, due every kWatchSeconds until it ended, however busy the loop is. None
  // while stdout is stuck: the launcher is not reading, and the bytes would only pile up.
  void check_watch() {
    double now = common::monotonic_seconds();
    if (status_ || now < next_watch_at_) return;
    next_watch_at_ += kWatchSeconds;
    if (next_watch_at_ <= now) next_watch_at_ = now + kWatchSeconds;  // fell behind: no burst
    if (output_.ready_size() >= kMaxReadyBytes) return;
    std::optional<common::ProgressSample> record;
    if (progress_path_) record = common::read_progress_record(*progress_path_);
    output_.add_marked(kEventMarker, format_agent_watch_event(read_process(child_->pid()), record));
  }

  // The session is gone (or the agent was told to stop): sig now, SIGKILL kill_after later. A
  // second reason can only bring the SIGKILL forward (the session closing during a signal's
  // grace still ends the group kill_after_seconds later).
  void begin_teardown(const std::string& why, int sig, double kill_after) {
    double now = common::monotonic_seconds();
    if (terminating_) {
      if (killed_ || now + kill_after >= kill_at_) return;
    } else if (!status_ || output_open()) {
      if (stdin_open_) warn(fmt::format("{}: stopping the worker's process group", why));
      child_->signal_group(sig);
    }
    terminating_ = true;
    kill_at_ = now + kill_after;
    give_up_at_ = kill_at_ + kGiveUpOutputSeconds;
    last_flush_at_ = give_up_at_ + kLastFlushSeconds;
  }

  void check_deadlines() {
    double now = common::monotonic_seconds();
    if (!terminating_ && options_.keepalive_seconds > 0 &&
        now - last_input_at_ > options_.keepalive_seconds) {
      begin_teardown(fmt::format("no word from the launcher for {:.0f} s", now - last_input_at_),
                     SIGTERM, options_.kill_after_seconds);
    }
    if (!terminating_) return;
    if (!killed_ && now >= kill_at_) {
      killed_ = true;
      if (!status_ || output_open()) child_->signal_group(SIGKILL);
    }
    // Something outside the group (it called setsid) still holds the pipe: stop reading it.
    if (now >= give_up_at_ && output_open()) close_worker_output();
  }

  int in_fd_;
  int out_fd_;
  AgentOptions options_;
  SignalFd& signals_;
  AgentControlSocket& control_;
  std::unique_ptr<AgentChild> child_;
  AgentOutput output_;
  std::string commands_;
  std::optional<std::string> progress_path_;
  AgentControlSocket::Handlers control_handlers_;
  double last_input_at_ = common::monotonic_seconds();
  double next_watch_at_ = common::monotonic_seconds() + kWatchSeconds;
  std::optional<ExitStatus> status_;
  bool stdin_open_ = true;
  bool stdout_broken_ = false;
  bool terminating_ = false;
  bool killed_ = false;
  double kill_at_ = 0, give_up_at_ = 0, last_flush_at_ = 0;
};

}  // namespace

int run_agent(int in_fd, int out_fd, const AgentOptions& options) {
  SignalFd signals;
  RequestLine first = read_request_line(in_fd, signals, options.request_seconds);
  AgentRequest request = parse_agent_request(first.line);
  AgentControlSocket control;
  std::vector<std::pair<std::string, std::string>> extra_env = {
      {common::kEnvControl.name, control.address()}};
  // The launcher's path names a file on its own host: the worker writes one here instead, which
  // the watch events carry (read_progress_record, as the launcher's freeze watch does locally).
  std::optional<std::string> progress_path;
  for (const auto& [name, value] : request.env) {
    if (name == common::kEnvProgressFile.name && !progress_path)
      progress_path = control.private_path("progress");
  }
  if (progress_path) extra_env.emplace_back(common::kEnvProgressFile.name, *progress_path);
  auto child = AgentChild::spawn(request, extra_env);
  NonBlocking nonblocking_out(out_fd);
  Agent agent(in_fd, out_fd, options, signals, control, std::move(child), std::move(first.rest),
              std::move(progress_path));
  return agent.run();
}

}  // namespace dtrain::launcher
