// TCP plumbing for the ring: listen, connect with a time-out, socket tuning, and reading or
// writing whole frames against a deadline. Every call that waits takes a Deadline and its error
// says what it waited for. No threads here; callers own the descriptors.
#pragma once

#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "worker/comm/frame.h"

namespace dtrain::comm {

/// A point on the monotonic clock with the text of what is being waited for.
class Deadline {
 public:
  Deadline(double seconds_from_now, std::string what);
  bool expired() const;
  /// Milliseconds left, clamped to [0, cap_ms], for poll().
  int poll_ms(int cap_ms = 1000) const;
  double seconds() const { return seconds_; }
  const std::string& what() const { return what_; }

 private:
  double at_;
  double seconds_;
  std::string what_;
};

/// What a rendezvous given up for a newer generation throws (CommOptions::superseded).
inline constexpr const char* kSuperseded =
    "rendezvous given up: the launcher re-forms the group as a newer generation";

/// Listening socket on host:port (SO_REUSEADDR, non-blocking, close-on-exec). Throws IoError
/// naming host:port when it cannot bind.
/// busy_seconds: how long a port still in use (EADDRINUSE) is tried again, every 50 ms (0: not).
common::UniqueFd listen_on(const std::string& host, int port, double busy_seconds = 0);

/// One connection attempt to host:port, trying each resolved address. Returns an invalid fd and
/// sets error when nothing accepted within timeout_seconds.
common::UniqueFd connect_once(const std::string& host, int port, double timeout_seconds,
                              std::string& error);

/// Non-blocking, TCP_NODELAY, 4 MiB send and receive buffers, close-on-exec.
void tune_socket(int fd);

/// "127.0.0.1:53412" of the far end, for logs.
std::string peer_name(int fd);

/// Writes a whole frame. Throws IoError "<peer>: ..." on error, closed peer or deadline.
void write_frame(int fd, FrameType type, const void* payload, size_t length,
                 const Deadline& deadline, const std::string& peer);

/// Reads one whole frame of type expected (bounded by its type's limit). An abort frame throws
/// IoError with the sender's message; any other type, a bad header, end of stream or the
/// deadline throws IoError "<peer>: ...". A header of another type is refused before its payload
/// is allocated or read, so at most max(limit of expected, kMaxAbortPayload) bytes are held.
std::vector<unsigned char> read_frame(int fd, FrameType expected, const Deadline& deadline,
                                      const std::string& peer);

/// Best effort: sends an abort frame with message without waiting more than ~100 ms.
void send_abort(int fd, const std::string& message) noexcept;

}  // namespace dtrain::comm
