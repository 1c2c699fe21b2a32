// See group_guardian.h. The guardian reads fixed-size records "+pgid" / "-pgid" from a pipe.
#include "launcher/process/group_guardian.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "common/errors.h"

namespace dtrain::launcher {
namespace {

struct Record {
  char op;
  int32_t pgid;
};

bool any_alive(const std::set<pid_t>& groups) {
  for (pid_t pgid : groups) {
    if (::killpg(pgid, 0) == 0) return true;
  }
  return false;
}

// Keeps only the pipe: no terminal, no lock file, no sockets of the launcher. close_range
// (Linux 5.9) closes every other descriptor in two calls, whatever RLIMIT_NOFILE is; the loop
// is for older kernels.
void close_other_files(int keep_fd) {
  int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(null_fd, fd);
  const unsigned keep = static_cast<unsigned>(keep_fd);
  if (keep_fd >= 3 && (keep == 3 || ::syscall(SYS_close_range, 3u, keep - 1, 0u) == 0) &&
      ::syscall(SYS_close_range, keep + 1, ~0u, 0u) == 0) {
    return;
  }
  for (int fd = 3; fd < 65536; ++fd) {
    if (fd != keep_fd) ::close(fd);
  }
}

[[noreturn]] void guardian_main(int read_fd) {
  ::prctl(PR_SET_NAME, "dtrain-guard");
  close_other_files(read_fd);
  // Ctrl-C and the launcher's own shutdown signals are not for the guardian.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  std::set<pid_t> groups;
  Record record{};
  while (true) {
    ssize_t n = ::read(read_fd, &record, sizeof record);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof record)) break;  // EOF: the launcher is gone
    if (record.op == '+') groups.insert(record.pgid);
    if (record.op == '-') groups.erase(record.pgid);
  }
  for (pid_t pgid : groups) ::killpg(pgid, SIGTERM);
  for (int i = 0; i < 20 && any_alive(groups); ++i) ::usleep(50 * 1000);
  for (pid_t pgid : groups) ::killpg(pgid, SIGKILL);
  ::_exit(0);
}

}  // namespace

GroupGuardian GroupGuardian::start() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw common::IoError(fmt::format("guardian pipe: {}", std::strerror(errno)));
  }
  common::UniqueFd read_end(fds[0]);
  common::UniqueFd write_end(fds[1]);
  pid_t pid = ::fork();
  if (pid < 0) throw common::IoError(fmt::format("fork guardian: {}", std::strerror(errno)));
  if (pid == 0) {
    write_end.reset();
    guardian_main(read_end.get());
  }
  return GroupGuardian(std::move(write_end), pid);
}

void GroupGuardian::send(char op, pid_t pgid) {
  if (!pipe_.valid()) return;
  Record record{op, static_cast<int32_t>(pgid)};
  // Records are smaller than PIPE_BUF, so each write is atomic.
  while (::write(pipe_.get(), &record, sizeof record) < 0 && errno == EINTR) {
  }
}

void GroupGuardian::watch(pid_t pgid) {
  send('+', pgid);
}
void GroupGuardian::forget(pid_t pgid) {
  send('-', pgid);
}

}  // namespace dtrain::launcher
