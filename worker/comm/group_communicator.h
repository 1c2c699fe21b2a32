// The training group as one communicator that outlives its members' failures
// (docs/design.md#in-place-recovery). It forwards every collective to the communicator of the
// current generation and turns any failure of one into GroupBroken, so the trainer can tell "the
// group broke" from its own errors. leave() closes that communicator; join(generation) makes the
// next one (a new rendezvous, the same rank and size), with a new window where the transport has
// one. The trainer keeps a reference to this object across generations. It also keeps the
// worker's progress record of collectives, which the launcher reads to find a frozen member.
// interrupt(generation) is the launcher's notice (a cut-off peer closes nothing, so only the
// launcher can tell): the one call from another thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/progress_record.h"
#include "worker/comm/communicator.h"

namespace dtrain::comm {

/// A collective failed: a peer died, froze past a time-out, aborted or was cut off, or the
/// launcher's notice interrupted it. What the inner communicator said is the message.
class GroupBroken : public common::IoError {
 public:
  using common::IoError::IoError;
};

/// Every call but the interrupts comes from one thread (the trainer's), which alone calls leave()
/// and join(). The interrupts may come from any thread: they hold mutex_, under which leave() and
/// join() swap the inner communicator; the collectives read it without a lock.
class GroupCommunicator final : public Communicator {
 public:
  /// Makes generation g's communicator (blocking for its rendezvous; IoError when it fails).
  using Factory = std::function<std::unique_ptr<Communicator>(int generation)>;

  /// Joins `generation` at once through factory (its IoError propagates as GroupBroken). record
  /// (may be null; must outlive this) counts every collective begun and ended, and the
  /// generation (docs/design.md#frozen-workers).
  GroupCommunicator(Factory factory, int generation,
                    common::ProgressRecordWriter* record = nullptr);
  ~GroupCommunicator() override;

  int generation() const { return generation_; }
  /// True between leave() and a successful join().
  bool left() const { return inner_ == nullptr; }
  /// Tells the peers this member leaves (abort with message) and closes the communicator: its
  /// links, listener, thread and window. Never throws. An interrupt may still reach the
  /// communicator during its abort (which then returns promptly), not once it is closing.
  void leave(const std::string& message) noexcept;
  /// Makes generation's communicator; leave() first. Throws GroupBroken when its rendezvous
  /// fails (another member failed meanwhile: ask for the next generation).
  void join(int generation);

  /// The launcher's notice (docs/design.md#in-place-recovery): the group re-forms as
  /// `generation`. When joined to an older generation, interrupts its communicator: the
  /// collective blocked now and every later one fail promptly with GroupBroken "... the
  /// launcher re-forms the group as generation G", and the trainer's usual path (leave, ask,
  /// join) follows. Ignored when generation <= this one's. While left (from leave() until join()
  /// has made the next communicator) it is kept for the next join: a join of an older
  /// generation than the newest notice fails at once with GroupBroken (that generation can no
  /// longer form), and a notice that comes during the rendezvous interrupts the communicator it
  /// made. True when it interrupted or was kept. Any thread; never throws; blocks only while
  /// leave() or join() swaps the communicator.
  bool interrupt(int generation) noexcept;
  /// Interrupts the current generation's communicator, whatever the generation, naming why.
  /// Any thread, as above.
  void interrupt(const std::string& why) noexcept override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(float* data, size_t count, ReduceOp op) override;
  void all_reduce_shards(int virtual_size, int first, float* const* buffers, int held, size_t count,
                         ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override;
  void abort(const std::string& message) noexcept override;
  Window window() override;
  ReduceTicket start_all_reduce(float* data, size_t count, ReduceOp op) override;
  void finish_all_reduce(ReduceTicket ticket) override;
  bool stream_ordered() const override;

 private:
  Communicator& current();
  /// Runs a call on the current communicator; any IoError becomes GroupBroken.
  template <typename Call>
  auto forward(Call&& call) -> decltype(call(std::declval<Communicator&>()));

  Factory factory_;
  common::ProgressRecordWriter* record_;
  /// Held by the interrupts, and by leave() and join() while they change inner_ or generation_
  /// (which only the trainer's thread does, so it reads them without the lock).
  std::mutex mutex_;
  std::unique_ptr<Communicator> inner_;
  int generation_ = 0;
  int noticed_ = 0;  ///< the newest generation a notice named (under mutex_)
  int rank_ = 0, size_ = 1;
};

}  // namespace dtrain::comm
