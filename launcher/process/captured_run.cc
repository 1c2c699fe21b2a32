// See captured_run.h. posix_spawn with two pipes and a poll loop; no Asio (it runs before the
// event loop exists, or beside it on a side thread).
#include "launcher/process/captured_run.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/unique_fd.h"

extern char** environ;

namespace dtrain::launcher {
namespace {

// This process's environment with env set on top ("NAME=value" strings).
std::vector<std::string> child_environment(
    const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> entries;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    bool replaced =
        std::any_of(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) entries.push_back(std::move(entry));
  }
  for (const auto& [name, value] : env) entries.push_back(name + "=" + value);
  return entries;
}

// Reads both pipes to their ends or the deadline; true when the deadline came first.
bool read_outputs(common::UniqueFd& out_read, common::UniqueFd& err_read, CapturedRun& run,
                  double deadline) {
  while (out_read.valid() || err_read.valid()) {
    double left = deadline - common::monotonic_seconds();
    if (left <= 0) return true;
    pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {err_read.get(), POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(std::ceil(std::min(left, 1.0) * 1000))) <= 0) continue;
    for (auto [fd, text] : {std::pair{&out_read, &run.out}, {&err_read, &run.err}}) {
      pollfd& p = fds[fd == &out_read ? 0 : 1];
      if (!fd->valid() || p.revents == 0) continue;
      char chunk[16384];
      ssize_t n = ::read(fd->get(), chunk, sizeof chunk);
      if (n > 0)
        text->append(chunk, static_cast<size_t>(n));
      else if (n == 0 || errno != EINTR)
        fd->reset();
    }
  }
  return false;
}

}  // namespace

std::string CapturedRun::ending() const {
  return signal ? fmt::format("signal {}", signal) : fmt::format("exit {}", exit_code);
}

CapturedRun run_captured(const std::vector<std::string>& argv,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         double timeout_seconds) {
  CapturedRun run;
  run.command = fmt::format("`{}`", fmt::join(argv, " "));
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw common::IoError(fmt::format("{}: pipe: {}", run.command, std::strerror(errno)));
  common::UniqueFd out_read(out[0]), out_write(out[1]), err_read(err[0]), err_write(err[1]);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&actions, out_write.get(), STDOUT_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, err_write.get(), STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> entries = child_environment(env);
  std::vector<char*> envp;
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw common::ConfigError(
        fmt::format("{}: cannot start {}: {}", run.command, argv[0], std::strerror(rc)));
  }
  out_write.reset();
  err_write.reset();
  bool timed_out =
      read_outputs(out_read, err_read, run, common::monotonic_seconds() + timeout_seconds);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!run.err.empty() && run.err.back() == '\n') run.err.pop_back();
  if (timed_out) {
    throw common::IoError(
        fmt::format("{} did not finish within {:g} s", run.command, timeout_seconds));
  }
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return run;
}

}  // namespace dtrain::launcher
