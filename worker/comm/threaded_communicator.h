// Asynchronous gradient all-reduce for host transports: a Communicator that wraps a blocking host
// communicator (the TCP ring) and runs started all-reduces on one communication thread, in start
// order, while the trainer's thread goes on with backward. It does not split, fuse or reorder
// buckets, so the bits are those of the inner all_reduce; and it never lets two threads use the
// inner communicator at once. Device memory is not its business (see host_staged_communicator.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/communicator.h"

namespace dtrain::comm {

/// Owns inner and one communication thread. All calls come from one thread (the trainer's); the
/// communication thread is the only other user of inner, and never at the same time.
///
/// Waits (finish_all_reduce, the drain before each blocking collective, abort, the destructor)
/// have no time-out of their own: each job is one inner all_reduce, which the link bounds by its
/// I/O time-out (and ends early on a peer's abort), so a wait lasts at most the jobs ahead of it
/// times that time-out. After the first failure no further job touches the link, so in practice
/// a failed run costs one time-out, not one per queued bucket.
class ThreadedCommunicator final : public Communicator {
 public:
  /// Takes ownership of inner, a host-memory communicator that is not thread-safe, and starts
  /// the communication thread.
  explicit ThreadedCommunicator(std::unique_ptr<Communicator> inner);
  /// Drops the jobs not yet begun, waits for the one in flight (bounded by the link's time-out,
  /// or ended by interrupt()), and joins the thread. Never throws. Buffers of dropped jobs are left
  /// as they are.
  ~ThreadedCommunicator() override;
  ThreadedCommunicator(const ThreadedCommunicator&) = delete;
  ThreadedCommunicator& operator=(const ThreadedCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  /// The blocking collectives first wait until every started all-reduce has run, then call inner
  /// on the caller's thread. If a started all-reduce failed (or abort was called) they throw its
  /// error without touching the link.
  void all_reduce(float* data, size_t count, ReduceOp op) override;
  void all_reduce_shards(int virtual_size, int first, float* const* buffers, int held, size_t count,
                         ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override;

  /// Stops accepting jobs, drops the queued ones (their tickets throw an IoError naming
  /// message), waits for the job in flight to end by itself (its own I/O, a peer's abort, an
  /// interrupt(), or the link's time-out), then calls inner's abort. Never throws. It may block
  /// up to one link time-out unless interrupted: the inner link is not safe to abort while
  /// another thread is inside it, but it is safe to interrupt.
  void abort(const std::string& message) noexcept override;
  /// Any thread: forwards to inner's interrupt (thread-safe by contract), so the job in flight
  /// fails promptly, every queued one after it with its error, and an abort() waiting for that
  /// job returns.
  void interrupt(const std::string& why) noexcept override { inner_->interrupt(why); }
  Window window() override { return inner_->window(); }

  /// Queues an in-place all-reduce of count floats of HOST memory and returns at once. data must
  /// stay valid and untouched until finish_all_reduce returns for the ticket. Throws at once,
  /// without queueing, the error of an earlier failed all-reduce or abort (fail fast).
  ReduceTicket start_all_reduce(float* data, size_t count, ReduceOp op) override;
  /// Blocks until the ticket's all-reduce has run (see the class note on time-outs); rethrows
  /// its error: the IoError it met, or that of the first failed all-reduce before it (later
  /// jobs fail with that error without touching the link). Tickets may be finished in any order.
  void finish_all_reduce(ReduceTicket ticket) override;

 private:
  struct Job {
    uint64_t id;
    float* data;
    size_t count;
    ReduceOp op;
  };

  void run_jobs() noexcept;  ///< the communication thread's loop
  /// Waits until the queue is empty and the thread idle; throws the recorded failure, if any.
  void drain();
  /// Caller holds mutex_. Records error as the failure of job first_failed and every job after
  /// it (unless an earlier job already failed), and drops the queued jobs without running them.
  void fail_from(uint64_t first_failed, std::exception_ptr error);

  std::unique_ptr<Communicator> inner_;
  const int rank_;
  const int size_;

  std::mutex mutex_;                     ///< guards the fields from here to failure_
  std::condition_variable wake_thread_;  ///< a job was queued, or stopping_
  std::condition_variable job_ended_;    ///< a job ran, failed or was dropped; the thread went idle
  std::deque<Job> queue_;                ///< started, not yet begun, in start order
  bool busy_ = false;                    ///< the thread is inside inner_->all_reduce
  bool stopping_ = false;                ///< the destructor runs: the thread exits once idle
  uint64_t done_through_ = 0;          ///< every job with id <= this has run (jobs run in id order)
  uint64_t failed_from_ = UINT64_MAX;  ///< first job that failed or was dropped; MAX: none
  std::exception_ptr failure_;         ///< the error of job failed_from_, rethrown for later ones

  std::thread thread_;  ///< last: started once every field above is ready
};

}  // namespace dtrain::comm
