// Collectives for ranks that all run on one host, through one shared memory segment (layout in
// shm_segment.h): each rank has a slot; all-reduce copies in, each rank sums its chunk from every
// slot in rank order, and everyone copies the sums out. Data that already lives in the ranks'
// windows (window()) is summed straight from them, and only the other ranks' sums are copied. Set
// up once over a bootstrap communicator, never used again; ranks on different hosts (or namespaces)
// get nullptr and keep the TCP ring. Host memory only, blocking, one collective at a time: no
// device memory, no asynchronous all-reduce of its own (wrap it in a ThreadedCommunicator for
// that).
//
// Synchronisation: every collective is a sequence of phases. After each phase a rank publishes
// its phase counter (release store in its ShmRankControl); a rank that needs a peer's phase spins
// ~20 us on it (acquire loads), then sleeps on it with FUTEX_WAIT (10 ms at a time) and, between
// sleeps, looks for an abort in the header, for an exited peer (pidfds), for an interrupt of
// this rank and at the deadline.
// A publisher calls FUTEX_WAKE only when the peer's sleepers count says someone sleeps.
// Every rank runs the same phases, so counters move in lockstep; a rank writes its slot only
// after every peer has published the phase in which it last read that slot.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/ring_identity.h"
#include "worker/comm/shm/shm_segment.h"
#include "worker/comm/shm/shm_sync.h"

namespace dtrain::comm {

struct ShmOptions {
  size_t slot_bytes = size_t{4} << 20;  ///< per rank; larger collectives go in pieces
  /// Per rank: memory the caller may keep its data in (window()); all-reduces there copy
  /// nothing in or out. Address space only until written.
  size_t window_bytes = 0;
  double collective_seconds = 600;  ///< for one whole collective, named in its time-out
  double setup_seconds = 30;        ///< for the descriptor hand-off in create()
  /// Tests only: replaces this rank's host identity (boot id and host name) when not empty.
  std::string host_identity_override;
};

class ShmCommunicator final : public Communicator {
 public:
  /// Collective over bootstrap (already connected, all of id's ranks; every rank must call it):
  /// gathers each rank's host identity and pid; when all run on this host, rank 0 makes the
  /// segment and hands it to the others over an abstract UNIX socket. Returns nullptr on every
  /// rank, and says why in *why_not when given, if any rank is elsewhere or any step failed on
  /// any rank (all agree through bootstrap). Blocks in bootstrap (its time-outs) and up to
  /// options.setup_seconds for the hand-off. Throws what bootstrap throws. Does not keep
  /// bootstrap.
  static std::unique_ptr<ShmCommunicator> create(Communicator& bootstrap, const RingIdentity& id,
                                                 const ShmOptions& options,
                                                 std::string* why_not = nullptr);
  ~ShmCommunicator() override = default;
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int rank() const override { return id_.rank; }
  int size() const override { return id_.size; }

  /// Each collective blocks up to options.collective_seconds. It throws IoError naming the peer
  /// when one aborts ("worker:1 (rank 1) aborted: ..."), exits ("worker:1 (rank 1) died",
  /// noticed within ~10 ms; the first death seen is posted in the segment, so ranks that see
  /// only a survivor leave next still name it) or does not arrive in time; after that every
  /// call throws the same error at once.
  void all_reduce(float* data, size_t count, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override;
  /// Marks the segment aborted by this rank with message (the first abort wins) and wakes every
  /// waiter. Never throws; safe from any thread, even during a collective of this rank.
  void abort(const std::string& message) noexcept override;
  /// This rank alone stops: its collective in progress (on another thread) throws IoError
  /// naming why within ~10 ms, as does every later one; nothing is posted in the segment (the
  /// peers learn of it from this rank's abort, or their own interrupt). Any thread; never
  /// throws.
  void interrupt(const std::string& why) noexcept override;
  /// This rank's window (ShmOptions::window_bytes), which every peer maps too.
  Window window() override;

 private:
  ShmCommunicator(const RingIdentity& id, const ShmOptions& options, MappedSegment segment,
                  const std::vector<pid_t>& pids);

  struct Wait;  ///< one collective's name and deadline
  Wait begin(const char* collective);
  void publish();
  void wait_for(int peer, const Wait& wait);
  void wait_all(const Wait& wait);
  void check_peers(int awaited, const Wait& wait);
  [[noreturn]] void fail(const std::string& message);
  /// Records reason (naming the failed rank) in the header unless a failure is there already,
  /// and wakes every waiter. True when this call recorded it.
  bool post_failure(const std::string& reason) noexcept;

  /// Says which call this rank is in (before its first publish of the call), and checks, after
  /// every peer published past that point, that they are in the same one.
  void describe_call(uint32_t kind, size_t count, size_t offset);
  void check_same_call(const Wait& wait);
  void all_reduce_piece(float* data, size_t count, ReduceOp op, const Wait& wait, bool first);
  void all_reduce_in_window(size_t offset, size_t count, ReduceOp op, const Wait& wait);
  /// Sums floats [begin, end) over every rank in rank order, each rank's values read through
  /// source(rank, index), handing each block of sums to store(index, sums, n).
  template <typename Source, typename Store>
  void sum_chunk(size_t begin, size_t end, ReduceOp op, Source source, Store store) const;
  float* slot_floats(int rank) const { return reinterpret_cast<float*>(segment_.slot(rank)); }
  float* window_floats(int rank) const { return reinterpret_cast<float*>(segment_.window(rank)); }

  RingIdentity id_;
  ShmOptions options_;
  MappedSegment segment_;
  PeerWatch peers_;
  uint32_t phase_ = 0;  ///< phases this rank has published
  /// More ranks than CPUs this process may run on: waits yield the CPU instead of pausing.
  bool oversubscribed_ = false;
  std::string failure_;  ///< the first error; once set, every collective throws it
  /// Set by interrupt() (any thread) after interrupted_why_, which is never written again.
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mutex_;  ///< one interrupt() at a time writes interrupted_why_
  std::string interrupted_why_;
};

}  // namespace dtrain::comm
