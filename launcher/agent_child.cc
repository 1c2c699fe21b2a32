// See agent_child.h. The child reports a failed chdir or exec through a close-on-exec pipe, so
// "program not found" is an error of the agent (exit 2) rather than a worker that exits 127.
#include "launcher/agent_child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "common/errors.h"
#include "launcher/agent_protocol.h"

extern char** environ;

namespace dtrain::launcher {
namespace {

constexpr int kExecReportMs = 10000;

enum class Stage : int { kChdir = 1, kExec = 2 };
struct ExecReport {
  Stage stage;
  int error;
};

// this process's environment with the additions, as "NAME=value" strings.
std::vector<std::string> merged_environment(
    const std::vector<std::pair<std::string, std::string>>& env,
    const std::vector<std::pair<std::string, std::string>>& extra) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    size_t eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : env) vars[name] = value;
  for (const auto& [name, value] : extra) vars[name] = value;
  std::vector<std::string> out;
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// In the child between fork and exec: only async-signal-safe calls (the agent has one thread).
[[noreturn]] void exec_child(pid_t agent, int null_fd, int output_fd, int report_fd,
                             const char* cwd, char** argv, char** envp) {
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the agent blocks signals for its signalfd
  ::signal(SIGPIPE, SIG_DFL);                  // and ignores SIGPIPE; exec keeps SIG_IGN
  ::setsid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != agent) ::_exit(137);  // the agent died before prctl ran
  ::dup2(null_fd, 0);
  ::dup2(output_fd, 1);
  ::dup2(output_fd, 2);
  ExecReport report{Stage::kChdir, 0};
  if (*cwd == '\0' || ::chdir(cwd) == 0) {
    environ = envp;  // execvp searches the worker's PATH
    ::execvp(argv[0], argv);
    report.stage = Stage::kExec;
  }
  report.error = errno;
  (void)!::write(report_fd, &report, sizeof report);
  ::_exit(127);
}

void throw_report(const ExecReport& report, const AgentRequest& request) {
  std::string reason = std::strerror(report.error);
  if (report.stage == Stage::kChdir) {
    throw common::ConfigError(
        fmt::format("agent: cannot enter the working folder \"{}\": {}", request.cwd, reason));
  }
  bool permanent = report.error == ENOENT || report.error == EACCES || report.error == ENOTDIR ||
                   report.error == ENOEXEC || report.error == ELOOP || report.error == EISDIR;
  std::string message = fmt::format("agent: cannot run \"{}\": {}", request.argv[0], reason);
  if (permanent) throw common::ConfigError(message);
  throw common::IoError(message);
}

// Waits for the exec report: nullopt when the pipe closed without one (exec succeeded).
std::optional<ExecReport> read_exec_report(int fd, pid_t pid) {
  pollfd p{fd, POLLIN, 0};
  int ready = 0;
  do {
    ready = ::poll(&p, 1, kExecReportMs);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    throw common::IoError(
        fmt::format("agent: the worker did not start within {} s", kExecReportMs / 1000));
  }
  ExecReport report{};
  ssize_t n = 0;
  do {
    n = ::read(fd, &report, sizeof report);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof report)) return std::nullopt;
  ::waitpid(pid, nullptr, 0);  // it has written its report and _exits
  return report;
}

}  // namespace

std::unique_ptr<AgentChild> AgentChild::spawn(
    const AgentRequest& request,
    const std::vector<std::pair<std::string, std::string>>& extra_env) {
  std::vector<std::string> env_strings = merged_environment(request.env, extra_env);
  std::vector<std::string> argv_strings = request.argv;
  std::vector<char*> envp = pointers(env_strings);
  std::vector<char*> argv = pointers(argv_strings);
  int output[2], report[2];
  if (::pipe2(output, O_CLOEXEC) != 0)
    throw common::IoError(fmt::format("agent: pipe: {}", std::strerror(errno)));
  common::UniqueFd output_read(output[0]), output_write(output[1]);
  if (::pipe2(report, O_CLOEXEC) != 0)
    throw common::IoError(fmt::format("agent: pipe: {}", std::strerror(errno)));
  common::UniqueFd report_read(report[0]), report_write(report[1]);
  common::UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_fd.valid())
    throw common::IoError(fmt::format("agent: /dev/null: {}", std::strerror(errno)));
  pid_t agent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw common::IoError(fmt::format("agent: fork: {}", std::strerror(errno)));
  if (pid == 0) {
    exec_child(agent, null_fd.get(), output_write.get(), report_write.get(), request.cwd.c_str(),
               argv.data(), envp.data());
  }
  output_write.reset();
  report_write.reset();
  if (auto failure = read_exec_report(report_read.get(), pid)) throw_report(*failure, request);
  return std::unique_ptr<AgentChild>(new AgentChild(pid, std::move(output_read)));
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
