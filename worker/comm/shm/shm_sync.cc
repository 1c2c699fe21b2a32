// See shm_sync.h. Raw syscalls, because glibc 2.31 wraps neither futex nor pidfd_open.
#include "worker/comm/shm/shm_sync.h"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace dtrain::comm {
namespace {

#ifndef SYS_pidfd_open
constexpr long kSysPidfdOpen = 434;  // the same number on every architecture
#else
constexpr long kSysPidfdOpen = SYS_pidfd_open;
#endif

uint32_t* futex_address(std::atomic<uint32_t>& word) {
  return reinterpret_cast<uint32_t*>(&word);
}

bool exited_by_kill(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::microseconds timeout) {
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1000000) * 1000;
  ::syscall(SYS_futex, futex_address(word), FUTEX_WAIT, seen, &relative, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, futex_address(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

PeerWatch::PeerWatch(const std::vector<pid_t>& pids, int self)
    : pids_(pids), pidfds_(pids.size()), watched_(pids.size(), false) {
  const pid_t me = ::getpid();
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (static_cast<int>(r) == self || pids_[r] == me || pids_[r] <= 0) continue;
    watched_[r] = true;
    pidfds_[r].reset(static_cast<int>(::syscall(kSysPidfdOpen, pids_[r], 0)));
  }
}

std::optional<int> PeerWatch::first_dead() const {
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (!watched_[r]) continue;
    if (!pidfds_[r].valid()) {
      if (exited_by_kill(pids_[r])) return static_cast<int>(r);
      continue;
    }
    pollfd entry{pidfds_[r].get(), POLLIN, 0};
    if (::poll(&entry, 1, 0) > 0 && (entry.revents & (POLLIN | POLLHUP | POLLERR)) != 0)
      return static_cast<int>(r);
  }
  return std::nullopt;
}

}  // namespace dtrain::comm
