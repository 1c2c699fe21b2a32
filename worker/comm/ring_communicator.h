// The Communicators the factory chooses between on CPUs: RingCommunicator runs the ring
// collectives over a connected RingLink; SoloCommunicator is the size-1 world and does nothing
// (but sum the virtual ranks it holds in an elastic all-reduce). Neither connects, retries or logs:
// the link is built and handed over already connected.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/ring_link.h"

namespace dtrain::comm {

/// Ring collectives (ring_algorithms.h) over a link it owns. Not thread-safe: one collective at
/// a time, from one thread. Collectives block in the link and throw its IoError.
class RingCommunicator final : public Communicator {
 public:
  /// Takes ownership of link, already connected to this rank's ring neighbours.
  RingCommunicator(std::unique_ptr<RingLink> link, int rank, int size);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(float* data, size_t count, ReduceOp op) override;
  /// virtual_ring_all_reduce over the link.
  void all_reduce_shards(int virtual_size, int first, float* const* buffers, int held, size_t count,
                         ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override;
  /// Forwards to the link's abort: best effort, never throws.
  void abort(const std::string& message) noexcept override;
  /// Forwards to the link's interrupt: any thread.
  void interrupt(const std::string& why) noexcept override;

 private:
  std::unique_ptr<RingLink> link_;
  int rank_;
  int size_;
  std::vector<float> scratch_;  ///< one slice of received floats, reused across all-reduces
};

/// A world of one (rank 0): every collective returns at once and leaves the data as it is, but
/// for all_reduce_shards holding several virtual ranks, which sums them here.
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float* data, size_t count, ReduceOp op) override;
  /// Holds the whole virtual ring (first 0 or not): virtual_ring_all_reduce with no link.
  void all_reduce_shards(int virtual_size, int first, float* const* buffers, int held, size_t count,
                         ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override { check_interrupted(); }
  /// Nothing to reduce, so nothing that could block: a graph may record it.
  bool stream_ordered() const override { return true; }
  /// A copy of mine.
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override;
  void abort(const std::string& message) noexcept override;
  /// Nothing here waits for a peer, but a group of one must still hear the launcher's notice (a
  /// group that shrank to one member grows again, docs/design.md#elastic-membership): after it,
  /// every collective throws IoError naming why, and the trainer re-forms as any member does.
  void interrupt(const std::string& why) noexcept override;

 private:
  void check_interrupted();
  std::atomic<bool> interrupted_{false};
  std::mutex mutex_;  ///< guards why_
  std::string why_;
};

}  // namespace dtrain::comm
