// See agent_child.h. Started by start_process(), which reports a failed chdir or exec, so
// "program not found" is an error of the agent (exit 2) rather than a worker that exits 127.
#include "launcher/placement/agent_child.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "launcher/placement/agent_protocol.h"
#include "launcher/process/process_start.h"

namespace dtrain::launcher {

std::unique_ptr<AgentChild> AgentChild::spawn(
    const AgentRequest& request,
    const std::vector<std::pair<std::string, std::string>>& extra_env) {
  ProcessStart start{request.argv, request.env, request.cwd};
  start.env.insert(start.env.end(), extra_env.begin(), extra_env.end());
  start.new_session = true;
  StartedProcess started = start_process(start);
  return std::unique_ptr<AgentChild>(new AgentChild(started.pid, std::move(started.output)));
}

AgentChild::~AgentChild() {
  ::killpg(pid_, SIGKILL);
  // The worker itself dies at once unless it is stuck in the kernel; then init reaps it later.
  for (int i = 0; i < 100; ++i) {
    pid_t got = ::waitpid(pid_, nullptr, WNOHANG);
    if (got == pid_ || (got < 0 && errno != EINTR)) return;
    ::usleep(1000);
  }
}

void AgentChild::signal_group(int sig) {
  ::killpg(pid_, sig);
}

void AgentChild::queue_signal(int sig, int value) {
  sigval sv{};
  sv.sival_int = value;
  ::sigqueue(pid_, sig, sv);
}

std::optional<ExitStatus> AgentChild::poll_exit() {
  if (status_) return status_;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid_) {
    return std::nullopt;
  }
  if (info.si_code == CLD_EXITED)
    status_ = ExitStatus::exited(info.si_status);
  else
    status_ = ExitStatus::killed(info.si_status);
  return status_;
}

}  // namespace dtrain::launcher
