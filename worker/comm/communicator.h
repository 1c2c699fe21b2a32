// What the trainer sees of the other workers: rank, size and the collectives. Ring over TCP on
// CPUs, NCCL on GPUs (later); a size-1 communicator does nothing. Chosen once, in the factory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::comm {

enum class ReduceOp { kSum, kMean };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// In-place all-reduce of count floats. Every rank ends with bit-identical values: the order of
  /// additions depends only on the ranks. Throws IoError naming a failed peer.
  virtual void all_reduce(float* data, size_t count, ReduceOp op) = 0;
  /// Copies bytes from root's buffer into every other rank's buffer (same size everywhere).
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  /// Returns once every rank has called barrier().
  virtual void barrier() = 0;
  /// Every rank's `bytes` bytes, in rank order (small values: sizes, flags, step numbers).
  virtual std::vector<uint8_t> all_gather(const void* mine, size_t bytes) = 0;
  /// Tells every peer that this rank failed, with message. Never throws.
  virtual void abort(const std::string& message) noexcept = 0;
};

}  // namespace dtrain::comm
