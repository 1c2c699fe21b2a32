// Gradient all-reduce of DEVICE memory over a host transport, for ranks that NCCL refuses (two
// workers sharing one GPU): each bucket is downloaded into a pinned host staging area, reduced
// there by the inner host communicator, and uploaded back. It is synchronous: start_all_reduce
// does all of it before returning, so communication does not overlap with backward. Host
// collectives go straight to inner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/mem/device.h"

namespace dtrain::comm {

/// Owns inner (a blocking host communicator); borrows device, which must outlive it. All calls
/// come from the trainer's thread, the one that uses device. Blocks as long as inner does (the
/// link's time-outs) plus the device's copies.
class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> inner, nn::Device& device);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  /// Host-memory collectives: forwarded to inner unchanged.
  void all_reduce(float* data, size_t count, ReduceOp op) override;
  void all_reduce_shards(int virtual_size, int first, float* const* buffers, int held, size_t count,
                         ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override;
  void abort(const std::string& message) noexcept override;
  /// Any thread: forwards to inner's interrupt.
  void interrupt(const std::string& why) noexcept override { inner_->interrupt(why); }

  /// data is device memory. Waits for the device's enqueued work (download does), reduces a host
  /// copy with inner->all_reduce, uploads it back and waits for the upload, all before returning:
  /// the ticket is already done. The staging area grows to the largest bucket and is kept.
  /// Throws inner's IoError; on a throw, data is left as it was.
  ReduceTicket start_all_reduce(float* data, size_t count, ReduceOp op) override;
  /// Nothing left to wait for; checks that the ticket was started.
  void finish_all_reduce(ReduceTicket ticket) override;

 private:
  std::unique_ptr<Communicator> inner_;
  nn::Device& device_;
  nn::PinnedBuffer<float> staging_;  ///< pinned host copy of one bucket; upload reads from it
};

}  // namespace dtrain::comm
