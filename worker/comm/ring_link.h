// The only thing the ring algorithms see of the network: this rank's two ring neighbours. Bytes go
// to the next rank and come from the previous one. TCP in production (tcp_ring_link.h), an
// in-process pipe in tests. Implementations frame, bound and authenticate; this is just bytes.
#pragma once

#include <cstddef>
#include <string>

namespace dtrain::comm {

class RingLink {
 public:
  virtual ~RingLink() = default;

  /// Sends send_bytes from send to the next rank while receiving exactly recv_bytes from the
  /// previous rank into recv; both may be 0. Blocks until both are done. Throws IoError naming
  /// the peer when it is lost, aborted, sent a bad frame, or a time-out passed. Not thread-safe:
  /// one collective at a time.
  virtual void send_recv(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) = 0;

  /// Tells both neighbours that this rank failed, with message, so they (and, by forwarding, the
  /// whole ring) fail fast. Best effort, never throws, never blocks for long.
  virtual void abort(const std::string& message) noexcept = 0;

  /// Makes the send_recv in progress (on another thread) and every later one throw IoError
  /// naming why, promptly, without telling the neighbours (Communicator::interrupt). The one
  /// thread-safe call: any thread, at any time while the link lives. Never throws or blocks.
  virtual void interrupt(const std::string& why) noexcept = 0;
};

}  // namespace dtrain::comm
