// An in-process RingLink for algorithm tests: ranks are threads, and rank r's link writes into an
// unbounded pipe that rank r+1 reads, one entry per call, so mismatched calls are caught. Sends
// never block; receives wait with a time-out. Aborts travel around the ring as the real link's
// do. It does not model back-pressure or lost peers, and it costs a mutex hand-off per call.
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

/// State shared by the links of one ring; every field is guarded by mutex.
struct InProcessRing {
  struct Pipe {
    std::deque<std::string> calls;  ///< one entry per send_recv of the writer, even empty ones
    bool aborted = false;
    std::string message;                    ///< the abort message, when aborted
    std::condition_variable reader_wakeup;  ///< on a write to this pipe, and on any abort
  };
  explicit InProcessRing(int size) : pipes(static_cast<size_t>(size)) {}

  std::mutex mutex;
  std::vector<Pipe> pipes;  ///< pipes[r]: written by rank r, read by rank (r + 1) % size
};

/// One rank's end of an InProcessRing. Used from one thread at a time, like any RingLink.
/// Stricter than a byte stream: call k of a rank must receive exactly what its previous rank sent
/// in its call k (0 bytes included), so a collective whose calls do not pair up fails here.
class InProcessLink final : public comm::RingLink {
 public:
  InProcessLink(std::shared_ptr<InProcessRing> ring, int rank, std::chrono::milliseconds timeout)
      : ring_(std::move(ring)), rank_(rank), timeout_(timeout) {}

  /// Queues send for the next rank (never blocks), then waits up to the time-out for the
  /// previous rank's matching call. What was sent before an abort is still delivered, as over
  /// TCP. Throws IoError when the wait ends on an abort of either pipe (passing the abort on) or
  /// on the time-out, and EnforceError when the sizes of the paired calls differ.
  void send_recv(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override {
    std::unique_lock<std::mutex> lock(ring_->mutex);
    throw_if_interrupted();
    const char* send_chars = send_bytes > 0 ? static_cast<const char*>(send) : "";
    outgoing().calls.emplace_back(send_chars, send_bytes);
    outgoing().reader_wakeup.notify_one();
    const size_t call = calls_++;
    InProcessRing::Pipe& in = incoming();
    in.reader_wakeup.wait_for(lock, timeout_, [&] {
      return !in.calls.empty() || in.aborted || outgoing().aborted || interrupted_;
    });
    throw_if_interrupted();
    if (in.calls.empty()) {
      throw_if_aborted();
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

/// size connected links; element r is rank r's. Receives give up after timeout.
inline std::vector<std::unique_ptr<comm::RingLink>> make_in_process_ring(
    int size, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  DT_ENFORCE(size >= 1, "in-process ring of size {}", size);
  auto ring = std::make_shared<InProcessRing>(size);
  std::vector<std::unique_ptr<comm::RingLink>> links;
  for (int rank = 0; rank < size; ++rank)
    links.push_back(std::make_unique<InProcessLink>(ring, rank, timeout));
  return links;
}

}  // namespace dtrain::testing
