// RingLink over TCP: data frames to the next rank on one socket, from the previous rank on
// another, both watched at once with poll() so a neighbour's abort or death is seen while
// waiting. On any failure it forwards an abort frame to both neighbours, so the whole ring fails
// fast with the first failure's message, and every later call throws at once. A rank that is
// done sends a goodbye first: an end of stream without one is a death. interrupt() shuts both
// sockets down from another thread (never closes them), which wakes the poll() at once.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/unique_fd.h"
#include "worker/comm/ring_identity.h"
#include "worker/comm/ring_link.h"
#include "worker/comm/tcp/acceptor.h"

namespace dtrain::comm {

class TcpRingLink : public RingLink {
 public:
  /// Takes the connected, authenticated sockets and the acceptor (kept to refuse late intruders).
  TcpRingLink(RingIdentity id, CommOptions options, common::UniqueFd next,
              common::UniqueFd previous, std::unique_ptr<Acceptor> acceptor);
  /// Says goodbye to both neighbours (unless broken or interrupted), so their last collective is
  /// not mistaken for a failure when this end closes.
  ~TcpRingLink() override;

  void send_recv(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) override;
  void abort(const std::string& message) noexcept override;
  /// Any thread: records why, then shuts both sockets down (SHUT_RDWR; they stay open until
  /// this link is destroyed), so the send_recv in progress wakes and throws why, as does every
  /// later one. No abort frame or goodbye is sent after it: the sockets are shut.
  void interrupt(const std::string& why) noexcept override;

 private:
  /// Throws the failure that ends this link: message, after sending it to both neighbours, or
  /// the interrupt's reason (nothing sent) once interrupted.
  [[noreturn]] void fail(const std::string& message);
  /// Reads what the next rank sent (goodbye, abort, or end of stream). still_sending: this
  /// call has data left for it, so even a goodbye is a failure.
  void check_next_side(bool still_sending);

  RingIdentity id_;
  CommOptions options_;
  common::UniqueFd next_, previous_;
  std::unique_ptr<Acceptor> acceptor_;
  std::string broken_;      ///< the failure that ended this link; "" while healthy
  bool next_left_ = false;  ///< the next rank said goodbye: nothing more may be sent to it
  /// Set by interrupt() (any thread) after interrupted_why_, which is never written again.
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mutex_;  ///< one interrupt() at a time writes interrupted_why_
  std::string interrupted_why_;
};

/// Connects to the next rank and proves this worker's identity, retrying until deadline. Throws
/// IoError naming the worker, its address and the last refusal reason.
common::UniqueFd connect_to_next(const RingIdentity& id, const CommOptions& options,
                                 const Deadline& deadline);

/// Connects this worker into the ring described by id: listens, connects to the next rank and
/// waits for the previous one, all within options.rendezvous_seconds. Throws IoError naming the
/// worker and address it waited for.
std::unique_ptr<TcpRingLink> rendezvous(const RingIdentity& id, const CommOptions& options);

}  // namespace dtrain::comm
