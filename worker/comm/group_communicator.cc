// See group_communicator.h.
#include "worker/comm/group_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace dtrain::comm {

GroupCommunicator::GroupCommunicator(Factory factory, int generation,
                                     common::ProgressRecordWriter* record)
    : factory_(std::move(factory)), record_(record) {
  join(generation);
}

GroupCommunicator::~GroupCommunicator() {
  std::unique_ptr<Communicator> closing;
  std::lock_guard<std::mutex> lock(mutex_);
  closing = std::move(inner_);
}

void GroupCommunicator::leave(const std::string& message) noexcept {
  if (!inner_) return;
  // Still reachable by an interrupt meanwhile: the abort may wait for a collective in flight
  // on the communication thread, which an interrupt ends.
  inner_->abort(message);
  std::unique_ptr<Communicator> closing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing = std::move(inner_);
  }
  closing.reset();  // outside the lock: it joins a thread and the listener
}

void GroupCommunicator::join(int generation) {
  DT_ENFORCE(!inner_, "join generation {} before leaving generation {}", generation, generation_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_ = generation;
    if (noticed_ > generation) {
      throw GroupBroken(fmt::format(
          "generation {}: the launcher re-forms the group as generation {}", generation, noticed_));
    }
  }
  if (record_) record_->set_generation(generation);
  std::unique_ptr<Communicator> made;
  try {
    made = factory_(generation);  // the rendezvous: no lock held, no interrupt reaches it
  } catch (const common::IoError& e) {
    throw GroupBroken(fmt::format("generation {}: {}", generation, e.what()));
  }
  DT_ENFORCE(made != nullptr, "no communicator for generation {}", generation);
  rank_ = made->rank();
  size_ = made->size();
  std::lock_guard<std::mutex> lock(mutex_);
  inner_ = std::move(made);
  if (noticed_ > generation)  // a notice that came during the rendezvous
    inner_->interrupt(fmt::format("the launcher re-forms the group as generation {}", noticed_));
}

bool GroupCommunicator::interrupt(int generation) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (generation <= generation_) return false;
    noticed_ = std::max(noticed_, generation);
    if (!inner_) return true;  // kept for the next join
    inner_->interrupt(fmt::format("the launcher re-forms the group as generation {}", generation));
    return true;
  } catch (...) {  // the lock or the text failed: nothing to do but let the link time out
    return false;
  }
}

void GroupCommunicator::interrupt(const std::string& why) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (inner_) inner_->interrupt(why);
  } catch (...) {  // as above
  }
}

Communicator& GroupCommunicator::current() {
  if (!inner_) throw GroupBroken(fmt::format("generation {} was left", generation_));
  return *inner_;
}

template <typename Call>
auto GroupCommunicator::forward(Call&& call) -> decltype(call(std::declval<Communicator&>())) {
  Communicator& c = current();
  struct Counted {  // begun now, ended however the call ends
    common::ProgressRecordWriter* record;
    explicit Counted(common::ProgressRecordWriter* r) : record(r) {
      if (record) record->begin_collective();
    }
    ~Counted() {
      if (record) record->end_collective();
    }
  } counted(record_);
  try {
    return call(c);
  } catch (const GroupBroken&) {
    throw;
  } catch (const common::IoError& e) {
    throw GroupBroken(e.what());
  }
}

void GroupCommunicator::all_reduce(float* data, size_t count, ReduceOp op) {
  forward([&](Communicator& c) { c.all_reduce(data, count, op); });
}

void GroupCommunicator::all_reduce_shards(int virtual_size, int first, float* const* buffers,
                                          int held, size_t count, ReduceOp op) {
  forward(
      [&](Communicator& c) { c.all_reduce_shards(virtual_size, first, buffers, held, count, op); });
}

void GroupCommunicator::broadcast(void* data, size_t bytes, int root) {
  forward([&](Communicator& c) { c.broadcast(data, bytes, root); });
}

void GroupCommunicator::barrier() {
  forward([&](Communicator& c) { c.barrier(); });
}

std::vector<uint8_t> GroupCommunicator::all_gather(const void* mine, size_t bytes) {
  return forward([&](Communicator& c) { return c.all_gather(mine, bytes); });
}

void GroupCommunicator::abort(const std::string& message) noexcept {
  if (inner_) inner_->abort(message);
}

Window GroupCommunicator::window() {
  return inner_ ? inner_->window() : Window{};
}

ReduceTicket GroupCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op) {
  return forward([&](Communicator& c) { return c.start_all_reduce(data, count, op); });
}

void GroupCommunicator::finish_all_reduce(ReduceTicket ticket) {
  forward([&](Communicator& c) { c.finish_all_reduce(ticket); });
}

bool GroupCommunicator::stream_ordered() const {
  return inner_ && inner_->stream_ordered();
}

}  // namespace dtrain::comm
