// HostStagedCommunicator: download, host all-reduce, upload, synchronize, one bucket at a time
// through a pinned staging area. No thread and no overlap with compute (that would need a copy
// stream and events, which a shared GPU's host ring does not earn); no logic beyond the copies.
#include "worker/comm/host_staged_communicator.h"

#include <utility>

#include "common/errors.h"

namespace dtrain::comm {

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> inner,
                                               nn::Device& device)
    : inner_(std::move(inner)), device_(device) {
  DT_ENFORCE(inner_ != nullptr, "host-staged communicator without an inner communicator");
}

void HostStagedCommunicator::all_reduce(float* data, size_t count, ReduceOp op) {
  inner_->all_reduce(data, count, op);
}

void HostStagedCommunicator::all_reduce_shards(int virtual_size, int first, float* const* buffers,
                                               int held, size_t count, ReduceOp op) {
  inner_->all_reduce_shards(virtual_size, first, buffers, held, count, op);
}

void HostStagedCommunicator::broadcast(void* data, size_t bytes, int root) {
  inner_->broadcast(data, bytes, root);
}

void HostStagedCommunicator::barrier() {
  inner_->barrier();
}

std::vector<uint8_t> HostStagedCommunicator::all_gather(const void* mine, size_t bytes) {
  return inner_->all_gather(mine, bytes);
}

void HostStagedCommunicator::abort(const std::string& message) noexcept {
  inner_->abort(message);
}

ReduceTicket HostStagedCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op) {
  DT_ENFORCE(data != nullptr || count == 0, "all-reduce of {} floats from a null buffer", count);
  if (count == 0) {  // still an all-reduce every rank makes, so the sequence stays paired
    inner_->all_reduce(nullptr, 0, op);
    return {next_ticket_++};
  }
  if (staging_.size() < count) {
    staging_ = nn::PinnedBuffer<float>();  // free the old area before taking a larger one
    staging_ = nn::PinnedBuffer<float>(device_, count);
  }
  const size_t bytes = count * sizeof(float);
  device_.download(staging_.data(), data, bytes);
  inner_->all_reduce(staging_.data(), count, op);
  device_.upload(data, staging_.data(), bytes);
  device_.synchronize();  // the upload reads staging_ when it runs; the next bucket reuses it
  return {next_ticket_++};
}

void HostStagedCommunicator::finish_all_reduce(ReduceTicket ticket) {
  DT_ENFORCE(ticket.id >= 1 && ticket.id < next_ticket_,
             "rank {}: ticket {} was never started (next is {})", rank(), ticket.id, next_ticket_);
}

}  // namespace dtrain::comm
