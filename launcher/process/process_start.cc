// See process_start.h. Everything the child needs (argv, envp, the program's path, descriptors)
// is made before vfork(); between vfork and exec the child makes only async-signal-safe calls,
// writes no memory of the parent's, and reports a failure as (stage, errno) through a
// close-on-exec pipe that exec closes on success.
//
// vfork() rather than fork(): the child borrows the parent's memory until it execs instead of
// copying its page tables, which costs the launcher of thousands of workers more with each one it
// holds (docs/benchmarks.md, spawn time). The parent thread waits meanwhile, as posix_spawn's
// does; the child has its own signal handler table (no CLONE_SIGHAND), so resetting handlers
// there leaves the parent's alone.
#include "launcher/process/process_start.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "common/clock.h"
#include "common/errors.h"

extern char** environ;

namespace dtrain::launcher {
namespace {

constexpr double kExecReportSeconds = 10;
constexpr const char* kDefaultPath = "/bin:/usr/bin";  // execvp's when PATH is unset

enum class Stage : int { kSetup = 1, kChdir = 2, kExec = 3 };
struct ExecReport {
  Stage stage;
  int error;
};

// This process's environment with overrides set on top (for a name given twice the last wins),
// as "NAME=value" entries in their first order.
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

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// `dir/name` if `dir` is relative and the child will run in cwd: where the child will look.
std::string as_seen_from(const std::string& cwd, const std::string& path) {
  if (cwd.empty() || path.empty() || path[0] == '/') return path;
  return cwd + "/" + path;
}

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// What the child will execve(): a path as given, or the first executable `dir/name` on the
// child's PATH (execvp's search, done before vfork because execvp may allocate).
std::string resolve_program(const std::string& name, const std::vector<std::string>& env,
                            const std::string& cwd) {
  if (name.find('/') != std::string::npos) return name;
  std::string path = kDefaultPath;
  for (const std::string& entry : env) {
    if (entry.rfind("PATH=", 0) == 0) path = entry.substr(5);
  }
  for (size_t start = 0; !name.empty() && start <= path.size();) {
    size_t end = std::min(path.find(':', start), path.size());
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (is_executable_file(as_seen_from(cwd, candidate))) return candidate;
    start = end + 1;
  }
  throw common::ConfigError(program_not_found_message(name));
}

[[noreturn]] void throw_io(const std::string& program, const char* what, int error) {
  bool no_fds = error == EMFILE || error == ENFILE;
  throw common::IoError(fmt::format("cannot start \"{}\": {}: {}{}", program, what,
                                    std::strerror(error),
                                    no_fds ? " (raise the open-file limit, ulimit -n)" : ""));
}

// fd moved above 0, 1 and 2, so that the child's dup2() onto them never meets itself.
common::UniqueFd above_stdio(common::UniqueFd fd, const std::string& program, const char* what) {
  if (!fd.valid()) throw_io(program, what, errno);
  if (fd.get() > STDERR_FILENO) return fd;
  common::UniqueFd moved(::fcntl(fd.get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1));
  if (!moved.valid()) throw_io(program, what, errno);
  return moved;
}

struct Pipe {
  common::UniqueFd read, write;
};

Pipe make_pipe(const std::string& program, const char* what) {
  int fds[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_io(program, what, errno);
  common::UniqueFd read(fds[0]), write(fds[1]);
  return {above_stdio(std::move(read), program, what),
          above_stdio(std::move(write), program, what)};
}

// Everything the child uses, made before vfork; the child only reads it.
struct ChildPlan {
  const char* program;
  char** argv;
  char** envp;
  const char* cwd;  ///< "" = stay
  int stdin_fd, output_fd, report_fd;
  pid_t parent;
  bool new_session;
};

[[noreturn]] void report_and_exit(int report_fd, Stage stage) {
  ExecReport report{stage, errno};
  (void)!::write(report_fd, &report, sizeof report);
  ::_exit(127);
}

// In the child between vfork and exec: only async-signal-safe calls, nothing written but its own
// stack frames and the kernel's state (errno aside, which the parent does not read after a
// successful vfork). Handlers the parent set (Asio's, which write to the parent's own pipe) are
// reset while every signal is still blocked. Never returns: the parent's frames are below.
[[noreturn]] void exec_child(const ChildPlan& plan) {
  struct sigaction action {};
  for (int sig = 1; sig < NSIG; ++sig) {
    if (::sigaction(sig, nullptr, &action) != 0) continue;
    if (action.sa_handler == SIG_IGN && sig != SIGPIPE) continue;  // nohup's SIGHUP stays
    action = {};
    action.sa_handler = SIG_DFL;
    ::sigaction(sig, &action, nullptr);
  }
  if (plan.new_session) {
    ::setsid();
  } else {
    ::setpgid(0, 0);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != plan.parent) ::_exit(137);  // the parent died before prctl ran
  if (::dup2(plan.stdin_fd, STDIN_FILENO) < 0 || ::dup2(plan.output_fd, STDOUT_FILENO) < 0 ||
      ::dup2(plan.output_fd, STDERR_FILENO) < 0) {
    report_and_exit(plan.report_fd, Stage::kSetup);
  }
  if (*plan.cwd != '\0' && ::chdir(plan.cwd) != 0) report_and_exit(plan.report_fd, Stage::kChdir);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(plan.program, plan.argv, plan.envp);
  report_and_exit(plan.report_fd, Stage::kExec);
}

void reap(pid_t pid) {
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

// Waits for the child's report: nothing when the pipe closed without one (exec succeeded).
std::optional<ExecReport> read_exec_report(int fd, pid_t pid, const std::string& program) {
  double deadline = common::monotonic_seconds() + kExecReportSeconds;
  ExecReport report{};
  for (;;) {
    int left_ms = static_cast<int>((deadline - common::monotonic_seconds()) * 1000);
    pollfd p{fd, POLLIN, 0};
    int ready = left_ms > 0 ? ::poll(&p, 1, left_ms) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    ssize_t n = ::read(fd, &report, sizeof report);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof report)) return std::nullopt;
    reap(pid);  // it has written its report and _exits
    return report;
  }
  ::kill(pid, SIGKILL);
  reap(pid);
  throw common::IoError(fmt::format("cannot start \"{}\": it did not reach exec within {:g} s",
                                    program, kExecReportSeconds));
}

// exec's errnos that a restart cannot cure: a person must fix the job.
bool is_permanent(int error) {
  for (int e : {ENOENT, EACCES, EPERM, ENOTDIR, ENOEXEC, ELOOP, EISDIR, ENAMETOOLONG, E2BIG}) {
    if (error == e) return true;
  }
  return false;
}

[[noreturn]] void throw_report(const ExecReport& report, const ProcessStart& start,
                               const std::string& program) {
  const std::string& name = start.argv[0];
  std::string reason = std::strerror(report.error);
  if (report.stage == Stage::kChdir) {
    throw common::ConfigError(fmt::format(
        "cannot enter the working folder \"{}\" to run \"{}\": {}", start.cwd, name, reason));
  }
  if (report.stage == Stage::kSetup)
    throw_io(name, "setting up its stdin and stdout", report.error);
  if (report.error == ENOENT) {
    if (::access(as_seen_from(start.cwd, program).c_str(), F_OK) != 0)
      throw common::ConfigError(program_not_found_message(name));
    reason += " (its #! interpreter or its loader is missing)";
  }
  std::string message = fmt::format("cannot run \"{}\": {}", name, reason);
  if (is_permanent(report.error)) throw common::ConfigError(message);
  throw common::IoError(message);
}

// vfork() with every signal blocked, so that none runs a parent's handler in the child. Returns
// once the child has exec'd or exited.
pid_t vfork_blocking_signals(const ChildPlan& plan) {
  sigset_t all, old;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::vfork();
  if (pid == 0) exec_child(plan);
  int error = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = error;
  return pid;
}

}  // namespace

std::string program_not_found_message(const std::string& program) {
  if (program.find('/') != std::string::npos)
    return fmt::format("program \"{}\" does not exist", program);
  return fmt::format("program \"{}\" not found on PATH", program);
}

StartedProcess start_process(const ProcessStart& start) {
  DT_ENFORCE(!start.argv.empty(), "no program to start");
  const std::string& name = start.argv[0];
  std::vector<std::string> env = child_environment(start.env);
  std::string program = resolve_program(name, env, start.cwd);
  std::vector<std::string> args = start.argv;
  std::vector<char*> argv = pointers(args);
  std::vector<char*> envp = pointers(env);
  common::UniqueFd input = start.stdin_fd < 0
                               ? common::UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC))
                               : common::UniqueFd(::fcntl(start.stdin_fd, F_DUPFD_CLOEXEC, 3));
  input = above_stdio(std::move(input), name, "its stdin");
  Pipe output = make_pipe(name, "a pipe for its output");
  Pipe report = make_pipe(name, "a pipe for its exec report");
  ChildPlan plan{program.c_str(),    argv.data(), envp.data(),
                 start.cwd.c_str(),  input.get(), output.write.get(),
                 report.write.get(), ::getpid(),  start.new_session};
  pid_t pid = vfork_blocking_signals(plan);
  if (pid < 0) throw_io(name, "vfork", errno);
  input.reset();
  output.write.reset();
  report.write.reset();
  if (auto failure = read_exec_report(report.read.get(), pid, name))
    throw_report(*failure, start, program);
  return StartedProcess{pid, std::move(output.read)};
}

unsigned long raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return static_cast<unsigned long>(limit.rlim_cur);
}

}  // namespace dtrain::launcher
