// The one file that uses Boost.Process: children in their own process group with a parent-death
// signal, combined output through an async pipe, exit seen through the io_context (SIGCHLD).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/process.hpp>
#include <boost/process/extend.hpp>
#include <cerrno>
#include <string_view>
#include <unordered_map>

#include "common/errors.h"
#include "launcher/agent_protocol.h"
#include "launcher/process_spawner.h"

namespace dtrain::launcher {
namespace {
namespace bp = boost::process;

// Runs in the child between fork and exec: own process group, and death with the launcher.
struct GroupAndDeathSignal : bp::extend::handler {
  pid_t launcher_pid;
  template <class Executor>
  void on_exec_setup(Executor&) const {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher_pid) ::_exit(137);  // the launcher died before prctl ran
  }
};

// Hands the child an environment built by child_environment() (execve's envp).
struct ExecEnvironment : bp::extend::handler {
  char** env;
  template <class Executor>
  void on_setup(Executor& exec) const {
    exec.env = env;
  }
};

// The launcher's environment with overrides set on top (for a name given twice, the last wins),
// as "NAME=value" entries. Built here, not with bp::environment: its find() compares the name
// with every entry over the name's length, reading past the end of shorter entries (Boost 1.74;
// ASan reported it once names as long as TORCHELASTIC_RESTART_COUNT were set).
std::vector<std::string> child_environment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::unordered_map<std::string, size_t> index;  // name -> entry
  std::vector<std::string> entries;
  auto set = [&](std::string name, std::string entry) {
    auto [at, added] = index.emplace(std::move(name), entries.size());
    if (added) {
      entries.push_back(std::move(entry));
    } else {
      entries[at->second] = std::move(entry);
    }
  };
  for (char** p = environ; *p != nullptr; ++p) {
    std::string_view entry(*p);
    set(std::string(entry.substr(0, entry.find('='))), std::string(entry));
  }
  for (const auto& [name, value] : overrides) set(name, name + "=" + value);
  return entries;
}

struct ChildState {
  explicit ChildState(boost::asio::io_context& io) : pipe(io) {}
  bp::async_pipe pipe;
  int agent_stdin = -1;  ///< write end of an agent's stdin, or -1
  bp::child process;
  std::array<char, 64 * 1024> buffer{};
  ChildCallbacks callbacks;
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

class BoostChild : public Child {
 public:
  BoostChild(std::shared_ptr<ChildState> state, int pid) : state_(std::move(state)), pid_(pid) {}
  ~BoostChild() override {
    state_->callbacks = {};
    boost::system::error_code ignored;
    state_->pipe.close(ignored);
    if (state_->process.valid()) state_->process.detach();  // the sigchld handler still reaps it
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
class AgentChild : public BoostChild {
 public:
  using BoostChild::BoostChild;
  ~AgentChild() override { close_stdin(); }
  /// Writes text to the agent's stdin; a session that is gone is not an error (its end shows
  /// as the remote shell's exit).
  void write_all(const std::string& text) {
    for (size_t done = 0; state_->agent_stdin >= 0 && done < text.size();) {
      ssize_t n = ::write(state_->agent_stdin, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // EPIPE: the launcher ignores SIGPIPE
      done += static_cast<size_t>(n);
    }
  }
  void signal_group(int sig) override {
    write_all(format_agent_signal_command(sig));
    if (sig == SIGKILL) {
      close_stdin();
      ::killpg(pid_, SIGKILL);
    }
  }

 private:
  void close_stdin() {
    if (state_->agent_stdin >= 0) ::close(state_->agent_stdin);
    state_->agent_stdin = -1;
  }
};

// The child's end as waitpid() saw it; nothing when its BoostChild is gone.
void report_exit(const std::weak_ptr<ChildState>& weak, const std::error_code& exit_ec) {
  auto locked = weak.lock();
  if (!locked || !locked->callbacks.on_exit) return;
  ExitStatus status = exit_ec ? ExitStatus::exited(-1)
                              : ExitStatus::from_wait_status(locked->process.native_exit_code());
  locked->callbacks.on_exit(status);
}

void set_cloexec(int fd) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

boost::filesystem::path find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) != 0) {
      throw common::ConfigError(
          fmt::format("program \"{}\" does not exist or is not executable", name));
    }
    return name;
  }
  boost::filesystem::path found = bp::search_path(name);
  if (found.empty())
    throw common::ConfigError(fmt::format("program \"{}\" not found on PATH", name));
  return found;
}

class BoostProcessSpawner : public ProcessSpawner {
 public:
  explicit BoostProcessSpawner(boost::asio::io_context& io) : io_(io) {}

  std::unique_ptr<Child> spawn(const SpawnRequest& request, ChildCallbacks callbacks) override {
    DT_ENFORCE(!request.argv.empty());
    boost::filesystem::path program = find_program(request.argv[0]);
    auto state = std::make_shared<ChildState>(io_);
    // Boost.Process opens pipes without O_CLOEXEC; without it every later worker would hold
    // this worker's pipe open and its end of output would never be seen.
    set_cloexec(state->pipe.native_source());
    set_cloexec(state->pipe.native_sink());
    state->callbacks = std::move(callbacks);
    std::vector<std::string> entries = child_environment(request.env);
    std::vector<char*> envp;
    for (std::string& entry : entries) envp.push_back(entry.data());
    envp.push_back(nullptr);
    ExecEnvironment env{{}, envp.data()};
    std::vector<std::string> args(request.argv.begin() + 1, request.argv.end());
    // An agent's stdin: a pipe whose write end stays with the launcher (close-on-exec, so no
    // other child holds it open and closing it is seen as the end of the session).
    bp::pipe agent_in;
    if (request.agent) {
      set_cloexec(agent_in.native_source());
      set_cloexec(agent_in.native_sink());
    }
    std::error_code ec;
    std::weak_ptr<ChildState> weak = state;
    // A child that is already dead when Boost.Process registers it is reported inside the
    // bp::child constructor, before state->process holds the status (it would read 0x17f,
    // "still active"), and before spawn() has returned. Posting the report runs it after both.
    auto on_exit = [weak, &io = io_](int, const std::error_code& exit_ec) {
      boost::asio::post(io, [weak, exit_ec] { report_exit(weak, exit_ec); });
    };
    auto start_dir = request.cwd.empty() ? boost::filesystem::current_path()
                                         : boost::filesystem::path(request.cwd);
    if (request.agent) {
      state->process =
          bp::child(bp::exe = program, bp::args = args, env, bp::start_dir = start_dir,
                    bp::std_in<agent_in, (bp::std_out & bp::std_err)> state->pipe,
                    bp::on_exit = on_exit, io_, GroupAndDeathSignal{{}, ::getpid()}, ec);
    } else {
      state->process =
          bp::child(bp::exe = program, bp::args = args, env, bp::start_dir = start_dir,
                    bp::std_in<bp::null, (bp::std_out & bp::std_err)> state->pipe,
                    bp::on_exit = on_exit, io_, GroupAndDeathSignal{{}, ::getpid()}, ec);
    }
    if (ec)
      throw common::IoError(fmt::format("cannot start {}: {}", program.string(), ec.message()));
    int pid = state->process.id();
    read_more(state);
    if (!request.agent) return std::make_unique<BoostChild>(std::move(state), pid);
    state->agent_stdin = ::fcntl(agent_in.native_sink(), F_DUPFD_CLOEXEC, 3);
    agent_in.close();  // the child has its own copy of the read end
    auto child = std::make_unique<AgentChild>(std::move(state), pid);
    child->write_all(request.agent_request);
    return child;
  }

 private:
  boost::asio::io_context& io_;
};

}  // namespace

std::unique_ptr<ProcessSpawner> make_boost_process_spawner(boost::asio::io_context& io) {
  return std::make_unique<BoostProcessSpawner>(io);
}

}  // namespace dtrain::launcher
