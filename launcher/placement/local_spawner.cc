// The real ProcessSpawner: children started by start_process() (own process group, parent-death
// signal), their combined output read through an Asio descriptor, and their exit seen on the
// io_context: on SIGCHLD, a non-blocking waitpid() of each child it started (never of others).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "common/errors.h"
#include "common/unique_fd.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/placement/process_spawner.h"
#include "launcher/process/oom_watch.h"
#include "launcher/process/process_start.h"

namespace dtrain::launcher {
namespace {

std::string first_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

struct ChildState {
  explicit ChildState(boost::asio::io_context& io) : pipe(io) {}
  boost::asio::posix::stream_descriptor pipe;  ///< owns the read end of the output pipe
  common::UniqueFd agent_stdin;                ///< write end of an agent's stdin, or none
  std::array<char, 64 * 1024> buffer{};
  ChildCallbacks callbacks;
  /// A worker on this machine: its memory cgroup's watch and OOM kill count at the spawn, to
  /// say so when the kernel's OOM killer ended it (ChildEnd::explanation). None for an agent's
  /// session, whose worker's memory is another machine's.
  std::optional<OomWatch> oom;
  std::optional<uint64_t> oom_kills_at_spawn;
};

void read_more(const std::shared_ptr<ChildState>& state) {
  state->pipe.async_read_some(
      boost::asio::buffer(state->buffer), [state](const boost::system::error_code& ec, size_t n) {
        if (n > 0 && state->callbacks.on_output) {
          state->callbacks.on_output(std::string_view(state->buffer.data(), n));
        }
        if (!ec) return read_more(state);
        if (state->callbacks.on_output_closed) state->callbacks.on_output_closed();
      });
}

// Reaps the children this spawner started, on each SIGCHLD and once right after each start (a
// child may have ended before the signal_set could see it). Reports come from io's handlers,
// never from inside spawn(). Its handlers hold it weakly: they do nothing once it is gone.
class ExitWatcher : public std::enable_shared_from_this<ExitWatcher> {
 public:
  explicit ExitWatcher(boost::asio::io_context& io) : io_(io), sigchld_(io, SIGCHLD) {}

  void start() { wait_for_signal(); }
  void watch(pid_t pid, std::weak_ptr<ChildState> state) {
    children_.emplace(pid, std::move(state));
    boost::asio::post(io_, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->sweep();
    });
  }

 private:
  void wait_for_signal() {
    sigchld_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec, int) {
      auto self = weak.lock();
      if (ec || !self) return;
      self->sweep();
      self->wait_for_signal();
    });
  }

  void sweep() {
    std::vector<std::pair<std::weak_ptr<ChildState>, ExitStatus>> ended;
    for (auto it = children_.begin(); it != children_.end();) {
      int status = 0;
      pid_t got = ::waitpid(it->first, &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) {
        ++it;
        continue;
      }
      // ECHILD: something else reaped it; its end is known, its status is not.
      ended.emplace_back(it->second, got == it->first ? ExitStatus::from_wait_status(status)
                                                      : ExitStatus::exited(-1));
      it = children_.erase(it);
    }
    // After the loop: a callback may start (watch) another child.
    for (auto& [weak, status] : ended) {
      auto state = weak.lock();
      if (!state || !state->callbacks.on_exit) continue;
      ChildEnd end(status);
      if (state->oom)
        if (std::optional<std::string> why = state->oom->explain(status, state->oom_kills_at_spawn))
          end.explanation = *why;
      auto on_exit = state->callbacks.on_exit;  // the callback may destroy the Child
      on_exit(end);
    }
  }

  boost::asio::io_context& io_;
  boost::asio::signal_set sigchld_;
  std::unordered_map<pid_t, std::weak_ptr<ChildState>> children_;  ///< started, not yet reaped
};

class LocalChild : public Child {
 public:
  LocalChild(std::shared_ptr<ChildState> state, int pid) : state_(std::move(state)), pid_(pid) {}
  ~LocalChild() override {
    state_->callbacks = {};
    boost::system::error_code ignored;
    state_->pipe.close(ignored);  // the ExitWatcher still reaps the process
  }
  int pid() const override { return pid_; }
  void signal_group(int sig) override { ::killpg(pid_, sig); }

 protected:
  std::shared_ptr<ChildState> state_;
  int pid_;
};

// A remote shell running `dtrain agent`: signals travel as commands on its stdin; SIGKILL also
// closes stdin and kills the local remote-shell group, which ends the remote group within 2 s
// even when the command cannot get through.
class AgentChild : public LocalChild {
 public:
  using LocalChild::LocalChild;
  ~AgentChild() override { state_->agent_stdin.reset(); }
  /// Writes text to the agent's stdin; a session that is gone is not an error (its end shows
  /// as the remote shell's exit).
  void write_agent(const std::string& text) override { write_all(text); }
  void write_all(const std::string& text) {
    for (size_t done = 0; state_->agent_stdin.valid() && done < text.size();) {
      ssize_t n = ::write(state_->agent_stdin.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // EPIPE: the launcher ignores SIGPIPE
      done += static_cast<size_t>(n);
    }
  }
  void queue_signal(int sig, int value) override {
    write_all(format_agent_queue_command(sig, value));
  }
  void signal_group(int sig) override {
    write_all(format_agent_signal_command(sig));
    if (sig == SIGKILL) {
      state_->agent_stdin.reset();
      ::killpg(pid_, SIGKILL);
    }
  }
};

// A pipe for an agent's stdin, both ends close-on-exec: the write end stays with the launcher,
// so no other child holds it open and closing it is seen as the end of the session.
std::pair<common::UniqueFd, common::UniqueFd> agent_stdin_pipe(const std::string& program) {
  int fds[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw common::IoError(fmt::format("cannot start \"{}\": a pipe for its stdin: {}", program,
                                      std::strerror(errno)));
  }
  return {common::UniqueFd(fds[0]), common::UniqueFd(fds[1])};
}

class LocalSpawner : public ProcessSpawner {
 public:
  explicit LocalSpawner(boost::asio::io_context& io)
      : io_(io), watcher_(std::make_shared<ExitWatcher>(io)) {
    watcher_->start();
  }

  std::unique_ptr<Child> spawn(const SpawnRequest& request, ChildCallbacks callbacks) override {
    DT_ENFORCE(!request.argv.empty());
    ProcessStart start{request.argv, request.env, request.cwd};
    std::pair<common::UniqueFd, common::UniqueFd> agent_in;  // read, write
    if (request.agent()) {
      agent_in = agent_stdin_pipe(request.argv[0]);
      start.stdin_fd = agent_in.first.get();
    }
    StartedProcess started = start_process(start);
    agent_in.first.reset();  // the child has its own copy of the read end
    auto state = std::make_shared<ChildState>(io_);
    state->callbacks = std::move(callbacks);
    if (!request.agent()) {
      state->oom = oom_;
      state->oom_kills_at_spawn = oom_.kills();
    }
    watcher_->watch(started.pid, state);  // first: it is reaped even if the rest throws
    boost::system::error_code ec;
    state->pipe.assign(started.output.get(), ec);
    if (ec) {
      state->callbacks = {};
      ::killpg(started.pid, SIGKILL);
      throw common::IoError(
          fmt::format("cannot read the output of \"{}\": {}", request.argv[0], ec.message()));
    }
    started.output.release();  // the stream_descriptor owns it now
    read_more(state);
    if (!request.agent()) return std::make_unique<LocalChild>(std::move(state), started.pid);
    state->agent_stdin = std::move(agent_in.second);
    auto child = std::make_unique<AgentChild>(std::move(state), started.pid);
    child->write_all(request.agent_request);
    return child;
  }

 private:
  boost::asio::io_context& io_;
  std::shared_ptr<ExitWatcher> watcher_;
  OomWatch oom_ = OomWatch::for_this_process();  ///< this machine's OOM kills
};

}  // namespace

void Child::queue_signal(int sig, int value) {
  union sigval v {};
  v.sival_int = value;
  ::sigqueue(pid(), sig, v);
}

std::string Child::sender_refusal(int peer_pid, const std::string& who) const {
  if (peer_pid > 0 && (peer_pid == pid() || ::getpgid(peer_pid) == pid())) return "";
  return fmt::format("pid {} is neither {}'s process (pid {}) nor in its process group", peer_pid,
                     who, pid());
}

// A frozen cgroup (v1 freezer.state, v2 cgroup.freeze; `docker pause`) holds the kill until it is
// thawed; a process in state D (uninterruptible sleep: a hung disk or NFS mount) takes it only
// when the sleep ends.
std::string Child::why_unkillable() const {
  std::ifstream cgroups("/proc/" + std::to_string(pid()) + "/cgroup");
  for (std::string line; std::getline(cgroups, line);) {  // "id:controllers:path"
    size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    if (controllers.find("freezer") != std::string::npos) {
      std::string dir = "/sys/fs/cgroup/freezer" + path;
      std::string state = first_line_of(dir + "/freezer.state");
      if (state == "FROZEN" || state == "FREEZING")
        return fmt::format("its cgroup {} is frozen (freezer.state {})", dir, state);
    } else if (controllers.empty()) {  // cgroup v2
      for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
        std::string dir = root + path;
        if (first_line_of(dir + "/cgroup.freeze") == "1")
          return fmt::format("its cgroup {} is frozen (cgroup.freeze 1)", dir);
      }
    }
  }
  std::string state;
  std::ifstream status("/proc/" + std::to_string(pid()) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("State:", 0) == 0) state = line.substr(line.find_first_not_of(" \t", 6));
  if (state.empty()) return "its end was not seen (it may be gone)";
  return fmt::format("it is in state {}", state);
}

MemberObservation Child::look(const std::string& progress_path) const {
  MemberObservation seen;
  seen.process = read_process(pid());
  if (!progress_path.empty()) seen.record = common::read_progress_record(progress_path);
  // A record left by the process before (a replaced member) is not this one's yet.
  if (seen.record && seen.record->pid != pid()) seen.record.reset();
  return seen;
}

std::unique_ptr<ProcessSpawner> make_local_spawner(boost::asio::io_context& io) {
  return std::make_unique<LocalSpawner>(io);
}

}  // namespace dtrain::launcher
