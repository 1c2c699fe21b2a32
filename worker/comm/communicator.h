// What the trainer sees of the other workers: rank, size and the collectives. Two kinds of call:
// blocking collectives on host memory (restore, checkpoints, barriers), and the asynchronous
// gradient all-reduce on memory of the model's device, started bucket by bucket while backward
// still runs. Ring over TCP on CPUs (with a communication thread), NCCL on GPUs (a communication
// stream ordered by events); a size-1 communicator does nothing. Chosen once, in the factory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"

namespace dtrain::comm {

enum class ReduceOp { kSum, kMean };

/// Host memory of one rank that its peers read directly (Communicator::window).
struct Window {
  float* data = nullptr;
  size_t floats = 0;

  bool empty() const { return floats == 0; }
  /// True when [at, at + count) lies inside the window.
  bool holds(const float* at, size_t count) const {
    return data != nullptr && at >= data && count <= floats &&
           static_cast<size_t>(at - data) <= floats - count;
  }
};

/// Names one started all-reduce; finish it exactly once.
struct ReduceTicket {
  uint64_t id = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Blocking in-place all-reduce of count floats in HOST memory. Every rank ends with
  /// bit-identical values: the order of additions depends only on the ranks. Throws IoError
  /// naming a failed peer. Waits for every started all-reduce to finish first.
  virtual void all_reduce(float* data, size_t count, ReduceOp op) = 0;
  /// Elastic all-reduce (virtual_ring_all_reduce's contract, blocking, host memory): buffers[j]
  /// holds count floats of virtual rank (first + j) % virtual_size; waits for every started
  /// all-reduce first (docs/design.md#elastic-membership). Default: when held == 1 and this is
  /// full membership (virtual_size == size(), first == rank()) it is all_reduce(buffers[0], ...);
  /// otherwise EnforceError (the transport cannot hold shards: only the TCP ring and a world of
  /// one can).
  virtual void all_reduce_shards(int virtual_size, int first, float* const* buffers, int held,
                                 size_t count, ReduceOp op) {
    DT_ENFORCE(held == 1 && virtual_size == size() && first == rank() && buffers != nullptr,
               "rank {} of {}: this transport cannot hold {} virtual ranks from {} of a virtual "
               "ring of {}",
               rank(), size(), held, first, virtual_size);
    all_reduce(buffers[0], count, op);
  }
  /// Copies bytes of HOST memory from root's buffer into every other rank's buffer.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  /// Returns once every rank has called barrier().
  virtual void barrier() = 0;
  /// Every rank's `bytes` bytes, in rank order (small values: sizes, flags, step numbers).
  virtual std::vector<uint8_t> all_gather(const void* mine, size_t bytes) = 0;
  /// Tells every peer that this rank failed, with message. Never throws.
  virtual void abort(const std::string& message) noexcept = 0;
  /// Makes the collective this rank is blocked in now, and every later one, fail promptly (well
  /// under a second) with IoError naming why, without waiting for any peer: for a peer cut off
  /// by the network, which closes nothing (docs/design.md#in-place-recovery, the notice). Tells
  /// no peer anything; abort() still does that. Never throws, never blocks for long. The one
  /// call that is thread-safe: any thread, at any time while this communicator lives, even
  /// during a collective, abort() or another interrupt() (the first why wins).
  virtual void interrupt(const std::string& why) noexcept = 0;
  /// Host memory of this rank that its peers read directly; empty when the transport has none.
  /// An all_reduce of data inside it skips the copies through the transport's own buffers,
  /// provided every rank passes the same offset into its own window and the same count (ranks
  /// that disagree fail). Valid while the communicator lives; zero-filled at first.
  virtual Window window() { return {}; }

  /// Starts an in-place all-reduce of count floats at data, memory of the device this
  /// communicator was made for (host memory for host communicators). It reads data only after
  /// the work already enqueued on that device (for CUDA: on its compute stream) has run.
  /// All-reduces run in the order they were started, and every rank must start the same
  /// sequence. Returns at once unless the transport needs the host (the default implementation
  /// reduces before returning). The result is bit-identical on every rank and across runs for
  /// the same sequence of (count) buckets.
  virtual ReduceTicket start_all_reduce(float* data, size_t count, ReduceOp op) {
    all_reduce(data, count, op);
    return {next_ticket_++};
  }
  /// Makes the work enqueued on the device after this call (host: the caller's next statement)
  /// wait until the ticket's all-reduce is done. Host communicators block here; NCCL only
  /// orders streams. Throws the IoError the all-reduce met.
  virtual void finish_all_reduce(ReduceTicket /*ticket*/) {}
  /// True when start/finish_all_reduce only enqueue device work and never block or touch the
  /// host (NCCL, a world of one), so they may be recorded into a CUDA graph.
  virtual bool stream_ordered() const { return false; }

 protected:
  uint64_t next_ticket_ = 1;
};

}  // namespace dtrain::comm
