// The waiting primitives of ShmCommunicator: futex sleep and wake on a 32-bit word in shared
// memory (no FUTEX_PRIVATE_FLAG: the word is shared between processes), and PeerWatch, which
// tells whether a peer's process has exited (pidfds). No collectives or time-outs here: the
// communicator decides how long to wait and whom to name.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/unique_fd.h"

namespace dtrain::comm {

/// Sleeps until *word is woken, differs from seen, or timeout passes (spurious returns allowed:
/// the caller re-checks). Never throws.
void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::microseconds timeout);
/// Wakes every thread or process sleeping on word. Never throws.
void futex_wake_all(std::atomic<uint32_t>& word);
/// A hint to the CPU inside a spin loop (pause on x86); a no-op elsewhere.
void cpu_relax();

/// Watches the processes of a world's ranks. Not thread-safe; one owner.
class PeerWatch {
 public:
  PeerWatch() = default;
  /// pids[r] is rank r's process as seen from this process; rank `self` is never watched (nor
  /// any rank whose pid is this process's: threads acting as ranks in tests). Uses pidfd_open
  /// where the kernel has it (Linux 5.3+), else kill(pid, 0), which cannot see zombies.
  PeerWatch(const std::vector<pid_t>& pids, int self);

  /// The lowest rank whose process has exited, if any. Polls without blocking; never throws.
  std::optional<int> first_dead() const;
  pid_t pid(int rank) const { return pids_[static_cast<size_t>(rank)]; }

 private:
  std::vector<pid_t> pids_;
  std::vector<common::UniqueFd> pidfds_;  ///< per rank; invalid when not watched or no pidfd
  std::vector<bool> watched_;
};

}  // namespace dtrain::comm
