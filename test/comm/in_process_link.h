// An in-process RingLink for algorithm tests: ranks are threads, and rank r's link writes into an
// unbounded pipe that rank r+1 reads, one entry per call, so mismatched calls are caught. Sends
// never block; receives wait with a time-out, on the wall clock or on the ring's simulated time,
// which only the test moves. Aborts travel around the ring as the real link's do. It does not
// model back-pressure or lost peers, and it costs a mutex hand-off per call.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "worker/comm/ring_link.h"

namespace dtrain::testing {

/// How a receive's time-out is measured.
enum class LinkTime {
  kWall,       ///< the steady clock's: a receive gives up when its time-out has passed
  kSimulated,  ///< the ring's: a receive gives up once InProcessRing::advance() has moved the
               ///< ring's time past its start plus the time-out, never by itself
};

/// With LinkTime::kSimulated, a receive that neither data, an abort nor advance() ends fails after
/// this much wall time, saying so: a guard so that a broken test fails instead of hanging, far
/// above the moment any working receive here takes.
inline constexpr std::chrono::seconds kSimulatedTimeGuard{60};

/// State shared by the links of one ring; every field is guarded by mutex.
struct InProcessRing {
  struct Pipe {
    std::deque<std::string> calls;  ///< one entry per send_recv of the writer, even empty ones
    bool aborted = false;
    std::string message;                    ///< the abort message, when aborted
    std::condition_variable reader_wakeup;  ///< on a write to this pipe, any abort, advance()
  };
  explicit InProcessRing(int size, LinkTime t = LinkTime::kWall)
      : time(t),
        pipes(static_cast<size_t>(size)),
        waiting(static_cast<size_t>(size), false),
        timeouts(static_cast<size_t>(size), 0) {}

  /// Moves simulated time on by by; receives whose time-out it reaches give up.
  void advance(std::chrono::milliseconds by) {
    std::lock_guard<std::mutex> lock(mutex);
    now += by;
    for (Pipe& pipe : pipes) pipe.reader_wakeup.notify_all();
  }
  /// Whether rank is inside a receive's wait now.
  bool is_waiting(int rank) {
    std::lock_guard<std::mutex> lock(mutex);
    return waiting[static_cast<size_t>(rank)];
  }
  /// Receives of rank that ended on their time-out so far.
  size_t timeouts_of(int rank) {
    std::lock_guard<std::mutex> lock(mutex);
    return timeouts[static_cast<size_t>(rank)];
  }

  const LinkTime time;
  std::mutex mutex;
  std::vector<Pipe> pipes;           ///< pipes[r]: written by rank r, read by rank (r + 1) % size
  std::chrono::milliseconds now{0};  ///< simulated time (LinkTime::kSimulated)
  std::vector<bool> waiting;         ///< waiting[r]: rank r is inside a receive's wait
  std::vector<size_t> timeouts;      ///< timeouts[r]: rank r's receives that ended on the time-out
};

/// One rank's end of an InProcessRing. Used from one thread at a time, like any RingLink.
/// Stricter than a byte stream: call k of a rank must receive exactly what its previous rank sent
/// in its call k (0 bytes included), so a collective whose calls do not pair up fails here.
class InProcessLink final : public comm::RingLink {
 public:
  InProcessLink(std::shared_ptr<InProcessRing> ring, int rank, std::chrono::milliseconds timeout)
      : ring_(std::move(ring)), rank_(rank), timeout_(timeout) {}

  /// Queues send for the next rank (never blocks), then waits up to the time-out (on the ring's
  /// LinkTime) for the previous rank's matching call. What was sent before an abort is still
  /// delivered, as over TCP. Throws IoError when the wait ends on an abort of either pipe
  /// (passing the abort on), on the time-out or on kSimulatedTimeGuard, and EnforceError when the
  /// sizes of the paired calls differ.
  void send_recv(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override {
    std::unique_lock<std::mutex> lock(ring_->mutex);
    throw_if_interrupted();
    const char* send_chars = send_bytes > 0 ? static_cast<const char*>(send) : "";
    outgoing().calls.emplace_back(send_chars, send_bytes);
    outgoing().reader_wakeup.notify_one();
    const size_t call = calls_++;
    InProcessRing::Pipe& in = incoming();
    wait_for_call(lock, in);
    throw_if_interrupted();
    if (in.calls.empty()) {
      throw_if_aborted();
      ++ring_->timeouts[static_cast<size_t>(rank_)];
      throw common::IoError(fmt::format(
          "in-process link: rank {} timed out after {} ms waiting for {} bytes from rank {}", rank_,
          timeout_.count(), recv_bytes, previous_rank()));
    }
    DT_ENFORCE_EQ(in.calls.front().size(), recv_bytes,
                  "bytes rank {} sent vs rank {} expected in call {}", previous_rank(), rank_,
                  call);
    if (recv_bytes > 0) std::memcpy(recv, in.calls.front().data(), recv_bytes);
    in.calls.pop_front();
  }

  /// Calls of the previous rank that no call here has received: 0 after a paired collective.
  size_t unread_calls() const {
    std::lock_guard<std::mutex> lock(ring_->mutex);
    return ring_->pipes[static_cast<size_t>(previous_rank())].calls.size();
  }

  /// Marks both of this rank's pipes aborted with message (the first message wins).
  void abort(const std::string& message) noexcept override {
    try {
      std::lock_guard<std::mutex> lock(ring_->mutex);
      mark_aborted(message);
    } catch (...) {  // best effort, as the interface says
    }
  }

  /// Makes the send_recv waiting now (another thread) and every later one throw why; tells no
  /// other rank.
  void interrupt(const std::string& why) noexcept override {
    try {
      std::lock_guard<std::mutex> lock(ring_->mutex);
      if (!interrupted_) interrupted_ = fmt::format("in-process link: rank {}: {}", rank_, why);
      for (InProcessRing::Pipe& pipe : ring_->pipes) pipe.reader_wakeup.notify_all();
    } catch (...) {  // best effort, as the interface says
    }
  }

 private:
  InProcessRing::Pipe& outgoing() { return ring_->pipes[static_cast<size_t>(rank_)]; }
  InProcessRing::Pipe& incoming() { return ring_->pipes[static_cast<size_t>(previous_rank())]; }
  int previous_rank() const {
    const int size = static_cast<int>(ring_->pipes.size());
    return (rank_ + size - 1) % size;
  }

  // Waits until in has a call, a pipe of this rank is aborted, the link is interrupted, or the
  // time-out passed. Caller holds lock.
  void wait_for_call(std::unique_lock<std::mutex>& lock, InProcessRing::Pipe& in) {
    auto ready = [&] {
      return !in.calls.empty() || in.aborted || outgoing().aborted || interrupted_.has_value();
    };
    const size_t me = static_cast<size_t>(rank_);
    ring_->waiting[me] = true;
    if (ring_->time == LinkTime::kWall) {
      in.reader_wakeup.wait_for(lock, timeout_, ready);
      ring_->waiting[me] = false;
      return;
    }
    const std::chrono::milliseconds deadline = ring_->now + timeout_;
    const bool woken = in.reader_wakeup.wait_for(lock, kSimulatedTimeGuard,
                                                 [&] { return ready() || ring_->now >= deadline; });
    ring_->waiting[me] = false;
    if (!woken) {
      throw common::IoError(fmt::format(
          "in-process link: rank {}: nothing ended its wait for rank {} within the {} s guard "
          "(simulated time never reached its time-out)",
          rank_, previous_rank(), kSimulatedTimeGuard.count()));
    }
  }

  // Caller holds the mutex.
  void mark_aborted(const std::string& message) {
    for (InProcessRing::Pipe* pipe : {&outgoing(), &incoming()}) {
      if (pipe->aborted) continue;
      pipe->aborted = true;
      pipe->message = message;
    }
    for (InProcessRing::Pipe& pipe : ring_->pipes) pipe.reader_wakeup.notify_all();
  }

  // Caller holds the mutex.
  void throw_if_interrupted() const {
    if (interrupted_) throw common::IoError(*interrupted_);
  }

  // Caller holds the mutex. Passes a neighbour's abort on, so the whole ring fails fast.
  void throw_if_aborted() {
    for (InProcessRing::Pipe* pipe : {&incoming(), &outgoing()}) {
      if (!pipe->aborted) continue;
      const std::string message = pipe->message;
      mark_aborted(message);
      throw common::IoError(
          fmt::format("in-process link: rank {}: peer aborted: {}", rank_, message));
    }
  }

  std::shared_ptr<InProcessRing> ring_;
  int rank_;
  std::chrono::milliseconds timeout_;
  size_t calls_ = 0;                        ///< send_recv calls so far, for messages
  std::optional<std::string> interrupted_;  ///< guarded by the ring's mutex
};

/// Links over ring, one per pipe; element r is rank r's. Receives give up after timeout on the
/// ring's LinkTime.
inline std::vector<std::unique_ptr<comm::RingLink>> make_in_process_ring(
    const std::shared_ptr<InProcessRing>& ring, std::chrono::milliseconds timeout) {
  DT_ENFORCE(!ring->pipes.empty(), "in-process ring of size 0");
  std::vector<std::unique_ptr<comm::RingLink>> links;
  for (size_t rank = 0; rank < ring->pipes.size(); ++rank)
    links.push_back(std::make_unique<InProcessLink>(ring, static_cast<int>(rank), timeout));
  return links;
}

/// size connected links; element r is rank r's. Receives give up after timeout (wall clock).
inline std::vector<std::unique_ptr<comm::RingLink>> make_in_process_ring(
    int size, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  DT_ENFORCE(size >= 1, "in-process ring of size {}", size);
  return make_in_process_ring(std::make_shared<InProcessRing>(size), timeout);
}

}  // namespace dtrain::testing
