// The collectives and waiting of ShmCommunicator (set-up is in shm_setup.cc). Sums are formed
// as ((x_0 + x_1) + x_2) + ... + x_{size-1} for every element, whichever rank owns the chunk, so
// all ranks get the same bits on every run; the piece size does not change them either.
#include "worker/comm/shm/shm_communicator.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <tuple>

#include "common/errors.h"
#include "worker/comm/ring_algorithms.h"

namespace dtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kSleep = std::chrono::microseconds(10000);
// Floats summed at a time in all-reduce: 16 KiB, a block that stays in the L1 cache.
constexpr size_t kSumBlock = 4096;
// ShmRankControl::call_kind of an all-reduce through the slots, or in the windows.
constexpr uint32_t kCopyReduce = 1;
constexpr uint32_t kWindowReduce = 2;

// CPUs this process may run on (its affinity mask; at least 1).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// True once a counter that wraps around has reached target.
bool reached(uint32_t counter, uint32_t target) {
  return static_cast<int32_t>(counter - target) >= 0;
}

}  // namespace

struct ShmCommunicator::Wait {
  const char* collective;
  Clock::time_point deadline;
};

ShmCommunicator::ShmCommunicator(const RingIdentity& id, const ShmOptions& options,
                                 MappedSegment segment, const std::vector<pid_t>& pids)
    : id_(id),
      options_(options),
      segment_(std::move(segment)),
      peers_(pids, id.rank),
      oversubscribed_(id.size > usable_cpus()) {}

ShmCommunicator::Wait ShmCommunicator::begin(const char* collective) {
  if (!failure_.empty()) throw common::IoError(failure_);
  if (interrupted_.load(std::memory_order_acquire)) fail(interrupted_why_);
  const auto limit = std::chrono::duration<double>(options_.collective_seconds);
  return {collective, Clock::now() + std::chrono::duration_cast<Clock::duration>(limit)};
}

void ShmCommunicator::fail(const std::string& message) {
  if (failure_.empty()) failure_ = message;
  throw common::IoError(failure_);
}

void ShmCommunicator::publish() {
  ShmRankControl& mine = segment_.control(id_.rank);
  mine.phase.store(++phase_, std::memory_order_seq_cst);
  if (mine.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(mine.phase);
}

void ShmCommunicator::check_peers(int awaited, const Wait& wait) {
  const ShmHeader& header = segment_.header();
  if (interrupted_.load(std::memory_order_acquire)) fail(interrupted_why_);
  std::string reason;
  if (header.aborted_by.load(std::memory_order_acquire) != 0) {
    reason = header.abort_message;
  } else if (const std::optional<int> dead = peers_.first_dead()) {
    reason = fmt::format("{} died (process {} exited)", id_.describe(*dead), peers_.pid(*dead));
    // Posted so that ranks which see only this rank exit next still name the first death.
    if (!post_failure(reason) && header.aborted_by.load(std::memory_order_acquire) != 0)
      reason = header.abort_message;
  } else if (Clock::now() >= wait.deadline) {
    fail(fmt::format("shared memory: timed out after {} s in {} waiting for {}",
                     options_.collective_seconds, wait.collective, id_.describe(awaited)));
  } else {
    return;
  }
  fail(fmt::format("shared memory: {} (seen by {} in {})", reason, id_.describe(id_.rank),
                   wait.collective));
}

bool ShmCommunicator::post_failure(const std::string& reason) noexcept {
  ShmHeader& header = segment_.header();
  uint32_t none = 0;
  const uint32_t me = static_cast<uint32_t>(id_.rank + 1);
  const bool first = header.abort_claim.compare_exchange_strong(none, me);
  if (first) {
    const size_t n = std::min(reason.size(), kShmAbortMessageBytes - 1);
    std::memcpy(header.abort_message, reason.data(), n);
    header.abort_message[n] = '\0';
    header.aborted_by.store(me, std::memory_order_release);
  }
  for (int r = 0; r < id_.size; ++r) futex_wake_all(segment_.control(r).phase);
  return first;
}

void ShmCommunicator::wait_for(int peer, const Wait& wait) {
  ShmRankControl& control = segment_.control(peer);
  auto done = [&] { return reached(control.phase.load(std::memory_order_acquire), phase_); };
  // More ranks than CPUs this process may run on: a spinning rank holds the CPU its peer needs,
  // so it yields instead of pausing (4 ranks on 2 cores: 4 KiB in tens of microseconds, not 200).
  const auto spin_until = Clock::now() + kSpin;
  do {
    for (int i = 0; i < 64; ++i) {
      if (done()) return;
      if (oversubscribed_)
        ::sched_yield();
      else
        cpu_relax();
    }
  } while (Clock::now() < spin_until);
  for (;;) {
    check_peers(peer, wait);
    control.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = control.phase.load(std::memory_order_seq_cst);
    if (!reached(seen, phase_)) futex_wait(control.phase, seen, kSleep);
    control.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (done()) return;
  }
}

void ShmCommunicator::wait_all(const Wait& wait) {
  for (int peer = 0; peer < id_.size; ++peer)
    if (peer != id_.rank) wait_for(peer, wait);
  // An abort that came while every peer still made progress must not be missed for long.
  if (segment_.header().aborted_by.load(std::memory_order_acquire) != 0)
    check_peers(id_.rank, wait);
}

void ShmCommunicator::all_reduce(float* data, size_t count, ReduceOp op) {
  const Wait wait = begin("all-reduce");
  DT_ENFORCE(data != nullptr || count == 0, "all-reduce of {} floats from a null buffer", count);
  if (id_.size == 1 || count == 0) return;
  const Window mine = window();
  if (mine.holds(data, count)) {
    all_reduce_in_window(static_cast<size_t>(data - mine.data), count, op, wait);
    return;
  }
  describe_call(kCopyReduce, count, 0);
  const size_t per_piece = segment_.layout().slot_bytes / sizeof(float);
  for (size_t offset = 0; offset < count; offset += per_piece)
    all_reduce_piece(data + offset, std::min(per_piece, count - offset), op, wait, offset == 0);
}

void ShmCommunicator::describe_call(uint32_t kind, size_t count, size_t offset) {
  ShmRankControl& mine = segment_.control(id_.rank);
  mine.call_kind.store(kind, std::memory_order_relaxed);
  mine.call_count.store(count, std::memory_order_relaxed);
  mine.call_offset.store(offset, std::memory_order_relaxed);
}

// On every all-reduce: compares the control lines' fields, and formats text only on a mismatch.
void ShmCommunicator::check_same_call(const Wait& wait) {
  auto call = [&](int r) {
    const ShmRankControl& c = segment_.control(r);
    return std::make_tuple(c.call_kind.load(std::memory_order_relaxed),
                           c.call_count.load(std::memory_order_relaxed),
                           c.call_offset.load(std::memory_order_relaxed));
  };
  auto describe = [&](int r) {
    const auto [kind, count, offset] = call(r);
    return kind == kWindowReduce
               ? fmt::format("{} floats at offset {} of its window", count, offset)
               : fmt::format("{} floats of its own memory", count);
  };
  const auto mine = call(id_.rank);
  for (int r = 0; r < id_.size; ++r) {
    if (r == id_.rank || call(r) == mine) continue;
    // Every rank sees the disagreement at this same point, so each fails without waiting.
    fail(fmt::format("shared memory: {} all-reduces {} in {} but {} all-reduces {}",
                     id_.describe(r), describe(r), wait.collective, id_.describe(id_.rank),
                     describe(id_.rank)));
  }
}

// Floats [begin, end) summed over every rank in rank order, in blocks that stay in the L1
// cache: each element is ((x0 + x1) + x2) + ..., so the bits depend neither on the block size
// nor on which rank sums. source(r, at) points at rank r's value of element at; each block's
// sums go to store(at, sums, n) once every source of the block has been read.
template <typename Source, typename Store>
void ShmCommunicator::sum_chunk(size_t begin, size_t end, ReduceOp op, Source source,
                                Store store) const {
  float sum[kSumBlock];
  for (size_t at = begin; at < end; at += kSumBlock) {
    const size_t n = std::min(kSumBlock, end - at);
    std::memcpy(sum, source(0, at), n * sizeof(float));
    for (int r = 1; r < id_.size; ++r) add_into(sum, source(r, at), n);
    if (op == ReduceOp::kMean) divide_by(sum, n, static_cast<float>(id_.size));
    store(at, sum, n);
  }
}

// Phases: (1) copy in the chunks the peers own (mine stays in data: only I read it); (2) sum my
// chunk over every rank, in rank order, into data and my slot; (3) copy every other chunk out of
// its owner's slot.
void ShmCommunicator::all_reduce_piece(float* data, size_t count, ReduceOp op, const Wait& wait,
                                       bool first) {
  const int me = id_.rank;
  const IndexRange mine = ring_chunk(count, id_.size, me);
  wait_all(wait);  // every peer is done reading the slots of the last collective
  std::memcpy(slot_floats(me), data, mine.begin * sizeof(float));
  std::memcpy(slot_floats(me) + mine.end, data + mine.end, (count - mine.end) * sizeof(float));
  publish();
  wait_all(wait);
  if (first) check_same_call(wait);
  // My own values are read from data, the same values my slot would hold.
  sum_chunk(
      mine.begin, mine.end, op,
      [&](int r, size_t at) { return (r == me ? data : slot_floats(r)) + at; },
      [&](size_t at, const float* sum, size_t n) {
        std::memcpy(data + at, sum, n * sizeof(float));
        std::memcpy(slot_floats(me) + at, sum, n * sizeof(float));
      });
  publish();
  wait_all(wait);
  for (int r = 0; r < id_.size; ++r) {
    if (r == me) continue;
    const IndexRange theirs = ring_chunk(count, id_.size, r);
    std::memcpy(data + theirs.begin, slot_floats(r) + theirs.begin, theirs.size() * sizeof(float));
  }
  publish();
}

// Data already in every rank's window at the same offset. Phases: (1) every rank has its data
// in place; (2) each sums its chunk straight from every window and writes the sums into every
// window (the chunk's owner is the only rank that touches that chunk anywhere until the end);
// (3) returns once every rank has written, since the caller may write its window as soon as
// this returns. Nothing is copied apart from the sums, and each chunk is read and written in
// one pass.
void ShmCommunicator::all_reduce_in_window(size_t offset, size_t count, ReduceOp op,
                                           const Wait& wait) {
  const IndexRange mine = ring_chunk(count, id_.size, id_.rank);
  auto data = [&](int r) { return window_floats(r) + offset; };
  describe_call(kWindowReduce, count, offset);
  publish();
  wait_all(wait);
  check_same_call(wait);
  sum_chunk(
      mine.begin, mine.end, op, [&](int r, size_t at) { return data(r) + at; },
      [&](size_t at, const float* sum, size_t n) {
        for (int r = 0; r < id_.size; ++r) std::memcpy(data(r) + at, sum, n * sizeof(float));
      });
  publish();
  wait_all(wait);
}

Window ShmCommunicator::window() {
  return {window_floats(id_.rank), segment_.layout().window_bytes / sizeof(float)};
}

void ShmCommunicator::broadcast(void* data, size_t bytes, int root) {
  const Wait wait = begin("broadcast");
  DT_ENFORCE(root >= 0 && root < id_.size, "broadcast root {} of {} ranks", root, id_.size);
  DT_ENFORCE(data != nullptr || bytes == 0, "broadcast of {} bytes into a null buffer", bytes);
  auto* out = static_cast<uint8_t*>(data);
  const size_t per_piece = segment_.layout().slot_bytes;
  for (size_t offset = 0; offset < bytes && id_.size > 1; offset += per_piece) {
    const size_t n = std::min(per_piece, bytes - offset);
    wait_all(wait);
    if (id_.rank == root) std::memcpy(segment_.slot(root), out + offset, n);
    publish();
    if (id_.rank != root) {
      wait_for(root, wait);
      std::memcpy(out + offset, segment_.slot(root), n);
    }
    publish();
  }
}

void ShmCommunicator::barrier() {
  const Wait wait = begin("barrier");
  publish();
  wait_all(wait);
}

std::vector<uint8_t> ShmCommunicator::all_gather(const void* mine, size_t bytes) {
  const Wait wait = begin("all-gather");
  DT_ENFORCE(mine != nullptr || bytes == 0, "all-gather of {} bytes from a null buffer", bytes);
  std::vector<uint8_t> result(bytes * static_cast<size_t>(id_.size));
  const auto* in = static_cast<const uint8_t*>(mine);
  const size_t per_piece = segment_.layout().slot_bytes;
  for (size_t offset = 0; offset < bytes; offset += per_piece) {
    const size_t n = std::min(per_piece, bytes - offset);
    wait_all(wait);
    std::memcpy(segment_.slot(id_.rank), in + offset, n);
    publish();
    wait_all(wait);
    for (int r = 0; r < id_.size; ++r)
      std::memcpy(result.data() + size_t(r) * bytes + offset, segment_.slot(r), n);
    publish();
  }
  return result;
}

void ShmCommunicator::abort(const std::string& message) noexcept {
  try {
    post_failure(id_.describe(id_.rank) + " aborted: " + message);
  } catch (...) {  // only the string could throw (out of memory): nothing more to do
  }
}

void ShmCommunicator::interrupt(const std::string& why) noexcept {
  std::unique_lock<std::mutex> lock(interrupt_mutex_, std::defer_lock);
  try {
    lock.lock();  // held until the flag is set: a second interrupt() leaves the text alone
    if (interrupted_.load(std::memory_order_relaxed)) return;
    interrupted_why_ =
        fmt::format("shared memory: {} interrupted: {}", id_.describe(id_.rank), why);
  } catch (...) {  // no memory for the text: interrupt all the same, with an empty reason
  }
  interrupted_.store(true, std::memory_order_release);
  // A sleeping wait_for() sleeps on its peer's phase word: wake them all (others' sleepers
  // there wake too, re-check and sleep again).
  for (int r = 0; r < id_.size; ++r) futex_wake_all(segment_.control(r).phase);
}

}  // namespace dtrain::comm
