// The Communicators the factory chooses between on CPUs: RingCommunicator runs the ring
// collectives over a connected RingLink; SoloCommunicator is the size-1 world and does nothing
// (but sum the virtual ranks it holds in an elastic all-reduce). Neither connects, retries or logs:
// the link is built and handed over already connected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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
  void barrier() override {}
  /// Nothing to reduce, so nothing that could block: a graph may record it.
  bool stream_ordered() const override { return true; }
  /// A copy of mine.
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override;
  void abort(const std::string& message) noexcept override;
  /// Nothing here ever waits for a peer, so there is nothing to interrupt.
  void interrupt(const std::string& /*why*/) noexcept override {}
};

}  // namespace dtrain::comm
