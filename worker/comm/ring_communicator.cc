// RingCommunicator forwards each collective to ring_algorithms with its link, rank, size and
// scratch; SoloCommunicator checks its arguments and returns (an elastic all-reduce sums
// locally). No logic of their own beyond that.
#include "worker/comm/ring_communicator.h"

#include <utility>
#include <vector>

#include "common/errors.h"
#include "worker/comm/ring_algorithms.h"

namespace dtrain::comm {

RingCommunicator::RingCommunicator(std::unique_ptr<RingLink> link, int rank, int size)
    : link_(std::move(link)), rank_(rank), size_(size) {
  DT_ENFORCE(link_ != nullptr, "ring communicator for rank {} without a link", rank);
  DT_ENFORCE(size >= 1 && rank >= 0 && rank < size, "rank {} of a ring of size {}", rank, size);
}

void RingCommunicator::all_reduce(float* data, size_t count, ReduceOp op) {
  ring_all_reduce(*link_, rank_, size_, data, count, op, scratch_);
}

void RingCommunicator::all_reduce_shards(int virtual_size, int first, float* const* buffers,
                                         int held, size_t count, ReduceOp op) {
  virtual_ring_all_reduce(link_.get(), rank_, size_, virtual_size, first, buffers, held, count, op,
                          scratch_);
}

void RingCommunicator::broadcast(void* data, size_t bytes, int root) {
  ring_broadcast(*link_, rank_, size_, data, bytes, root);
}

void RingCommunicator::barrier() {
  ring_barrier(*link_, rank_, size_);
}

std::vector<uint8_t> RingCommunicator::all_gather(const void* mine, size_t bytes) {
  return ring_all_gather(*link_, rank_, size_, mine, bytes);
}

void RingCommunicator::abort(const std::string& message) noexcept {
  link_->abort(message);
}

void RingCommunicator::interrupt(const std::string& why) noexcept {
  link_->interrupt(why);
}

void SoloCommunicator::interrupt(const std::string& why) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (interrupted_) return;  // the first why wins
  try {
    why_ = why;
  } catch (...) {  // no memory for the words: the notice still counts
  }
  interrupted_ = true;
}

void SoloCommunicator::check_interrupted() {
  if (!interrupted_.load()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  throw common::IoError(why_.empty() ? std::string("interrupted") : why_);
}

void SoloCommunicator::all_reduce(float* data, size_t count, ReduceOp /*op*/) {
  check_interrupted();
  // The sum of one rank is its data; the mean divides by 1.
  DT_ENFORCE(data != nullptr || count == 0, "all-reduce of {} floats from a null buffer", count);
}

void SoloCommunicator::all_reduce_shards(int virtual_size, int first, float* const* buffers,
                                         int held, size_t count, ReduceOp op) {
  check_interrupted();
  std::vector<float> unused_scratch;  // nothing goes over a link
  virtual_ring_all_reduce(nullptr, 0, 1, virtual_size, first, buffers, held, count, op,
                          unused_scratch);
}

void SoloCommunicator::broadcast(void* data, size_t bytes, int root) {
  check_interrupted();
  DT_ENFORCE(root == 0, "broadcast root {} in a world of one", root);
  DT_ENFORCE(data != nullptr || bytes == 0, "broadcast of {} bytes into a null buffer", bytes);
}

std::vector<uint8_t> SoloCommunicator::all_gather(const void* mine, size_t bytes) {
  check_interrupted();
  DT_ENFORCE(mine != nullptr || bytes == 0, "all-gather of {} bytes from a null buffer", bytes);
  const auto* first = static_cast<const uint8_t*>(mine);
  return bytes == 0 ? std::vector<uint8_t>() : std::vector<uint8_t>(first, first + bytes);
}

void SoloCommunicator::abort(const std::string& /*message*/) noexcept {}

}  // namespace dtrain::comm
