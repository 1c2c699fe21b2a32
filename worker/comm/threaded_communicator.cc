// ThreadedCommunicator: a queue of started all-reduces under one mutex, one thread that runs them
// in order with the inner communicator's blocking all_reduce, and a first-failure record that
// fails every later job without running it. No time-outs of its own (the link has them), no
// retries and no logging: errors go back to the trainer through finish_all_reduce.
#include "worker/comm/threaded_communicator.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

#include "common/errors.h"
#include "common/thread_name.h"

namespace dtrain::comm {

ThreadedCommunicator::ThreadedCommunicator(std::unique_ptr<Communicator> inner)
    : inner_(std::move(inner)),
      rank_(inner_ ? inner_->rank() : -1),
      size_(inner_ ? inner_->size() : 0) {
  DT_ENFORCE(inner_ != nullptr, "threaded communicator without an inner communicator");
  thread_ = std::thread([this] { run_jobs(); });
}

ThreadedCommunicator::~ThreadedCommunicator() {
  try {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      if (!queue_.empty()) {
        fail_from(queue_.front().id,
                  std::make_exception_ptr(common::IoError(fmt::format(
                      "rank {}: all-reduce dropped: the communicator was destroyed", rank_))));
      }
    }
    wake_thread_.notify_all();
    if (thread_.joinable()) thread_.join();
  } catch (...) {  // a destructor never throws; the thread holds no resource the process needs
  }
}

void ThreadedCommunicator::run_jobs() noexcept {
  // Reduce as soon as a peer's data arrives rather than at the compute threads' next time
  // slice: on a host whose cores all compute, this is most of the overlap. Needs CAP_SYS_NICE
  // (root); without it the thread keeps the process's priority, which is only slower.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), -5);
  common::name_this_thread("dt-comm");
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_thread_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and the destructor dropped what was queued
    const Job job = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      inner_->all_reduce(job.data, job.count, job.op);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    done_through_ = job.id;
    if (error) fail_from(job.id, std::move(error));
    job_ended_.notify_all();
  }
}

void ThreadedCommunicator::fail_from(uint64_t first_failed, std::exception_ptr error) {
  if (first_failed < failed_from_) {
    failed_from_ = first_failed;
    failure_ = std::move(error);
  }
  queue_.clear();
  job_ended_.notify_all();
}

ReduceTicket ThreadedCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op) {
  DT_ENFORCE(data != nullptr || count == 0, "all-reduce of {} floats from a null buffer", count);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
    queue_.push_back(Job{next_ticket_, data, count, op});
  }
  wake_thread_.notify_one();
  return {next_ticket_++};
}

void ThreadedCommunicator::finish_all_reduce(ReduceTicket ticket) {
  DT_ENFORCE(ticket.id >= 1 && ticket.id < next_ticket_,
             "rank {}: ticket {} was never started (next is {})", rank_, ticket.id, next_ticket_);
  std::unique_lock<std::mutex> lock(mutex_);
  job_ended_.wait(lock, [&] { return done_through_ >= ticket.id || ticket.id >= failed_from_; });
  if (ticket.id >= failed_from_) std::rethrow_exception(failure_);
}

void ThreadedCommunicator::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  job_ended_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (failure_) std::rethrow_exception(failure_);
}

void ThreadedCommunicator::all_reduce(float* data, size_t count, ReduceOp op) {
  drain();
  inner_->all_reduce(data, count, op);
}

void ThreadedCommunicator::all_reduce_shards(int virtual_size, int first, float* const* buffers,
                                             int held, size_t count, ReduceOp op) {
  drain();
  inner_->all_reduce_shards(virtual_size, first, buffers, held, count, op);
}

void ThreadedCommunicator::broadcast(void* data, size_t bytes, int root) {
  drain();
  inner_->broadcast(data, bytes, root);
}

void ThreadedCommunicator::barrier() {
  drain();
  inner_->barrier();
}

std::vector<uint8_t> ThreadedCommunicator::all_gather(const void* mine, size_t bytes) {
  drain();
  return inner_->all_gather(mine, bytes);
}

void ThreadedCommunicator::abort(const std::string& message) noexcept {
  try {
    std::unique_lock<std::mutex> lock(mutex_);
    // Jobs from the first queued one on (or from the next one started) fail with this message.
    const uint64_t first_dropped = queue_.empty() ? next_ticket_ : queue_.front().id;
    fail_from(first_dropped,
              std::make_exception_ptr(common::IoError(fmt::format(
                  "rank {}: all-reduce not run: this rank aborted: {}", rank_, message))));
    job_ended_.wait(lock, [&] { return !busy_; });
  } catch (...) {  // best effort: inner's abort below still runs
  }
  inner_->abort(message);
}

}  // namespace dtrain::comm
