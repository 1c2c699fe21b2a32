// The launcher's UNIX socket: workers send heartbeats and progress on it (DTRAIN_CONTROL), and
// `dtrain status` / `dtrain stop` send requests ({"request": "status"}) that get one JSON line
// back, at once or, for the kinds given to defer() (a worker's reform request), later. Only this
// user may connect (socket 0600 in a 0700 run directory or this user's private /tmp/dtrain-<uid>,
// and the peer's uid is checked); a line that speaks for a task is refused unless the connection's
// process may speak for it (check_senders). Malformed lines are answered with an error and dropped.
// What one client can cost is bounded (ControlLimits): an overlong line, too many unread replies or
// a long silence close its connection, the oldest idle connection makes room when all are taken, a
// closed connection is released at once, warnings are logged at most once a second, and accept()
// failing (out of descriptors) pauses accepting instead of spinning. Runs on the io_context's
// thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/control_protocol.h"

namespace boost::asio {
class io_context;
}

namespace dtrain::launcher {

/// What a client of the control socket may cost the launcher.
struct ControlLimits {
  /// Open connections (each worker holds one); when all are taken, the one idle longest is
  /// closed to make room for the new one.
  size_t max_connections = 256;
  /// A connection that sends nothing and has nothing left to read for this long is closed
  /// (a worker's ControlClient reconnects by itself).
  double idle_seconds = 120;
  /// A longer line closes its connection.
  size_t max_line_bytes = 8192;
  /// Replies written but not yet taken by the client; more close its connection.
  size_t max_queued_reply_bytes = 1 << 20;
  /// Pause after accept() fails (out of descriptors or memory) before trying again.
  double accept_pause_seconds = 0.2;
};

class ControlServer {
 public:
  using Handler = std::function<void(const common::ControlMessage&)>;
  /// Answers a request line (the parsed JSON object's text); returns the reply JSON (one line).
  using RequestHandler = std::function<std::string(const std::string& request_json)>;
  /// Writes one reply line (a trailing newline is dropped) on the connection a deferred request
  /// came on, if it is still open; does nothing once it is closed or after the first call. Call
  /// on the io_context's thread.
  using Reply = std::function<void(const std::string& line)>;
  /// Takes a request to answer later (the parsed JSON object's text) and the way to answer it.
  using DeferredRequestHandler = std::function<void(const std::string& request_json, Reply reply)>;

  /// Seconds on a monotonic clock; only differences mean anything.
  using Clock = std::function<double()>;

  /// Listens on path (an old socket file there is replaced; the folder must exist), mode 0600.
  /// Throws IoError naming the path. clock (empty: common::monotonic_seconds) is the time the
  /// warnings' limit of one a second and "idle longest" are measured on, so a test can drive it;
  /// the idle and accept-pause timers run on the io_context's steady clock regardless.
  ControlServer(boost::asio::io_context& io, std::string path, Handler handler,
                RequestHandler requests = {}, ControlLimits limits = {}, Clock clock = {});
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  /// Requests {"request": kind} go to handler, which may answer them later (a reform request
  /// waits for the supervisor's decision; docs/design.md#in-place-recovery). One connection has at
  /// most one such request pending: another one before its reply is answered with an error at
  /// once. The reply holds its connection weakly, so a closed connection is released at once
  /// and its reply dropped.
  void defer(const std::string& kind, DeferredRequestHandler handler);

  /// Whether the process at the other end of a connection (SO_PEERCRED's pid, taken when it
  /// connected) may send a line naming task ("worker:1", "spare:0"): "" when it may, else why not.
  /// kind is the request's kind ("reform", "spare", ...) or "message" for a heartbeat or progress.
  using SenderCheck =
      std::function<std::string(const std::string& kind, const std::string& task, int peer_pid)>;
  /// From now on, control messages (their "task") and deferred requests (their "task", or a
  /// spare's "spare") are checked with check: a refused request is answered {"request": kind,
  /// "ok": false, "error": ...} and a refused message dropped, each logged (docs/control.md).
  /// Requests without a deferred handler (status, stop) are not checked.
  void check_senders(SenderCheck check);

  /// "unix:<path>", the value of DTRAIN_CONTROL.
  std::string address() const;
  /// Connections not yet closed (at most ControlLimits::max_connections).
  size_t open_connections() const;
  /// Connections whose memory is still held, closed or not; a closed one is released as soon as
  /// its pending handlers have run (no timer keeps it).
  size_t live_connections() const;
  /// Warnings not logged since the last one that was (at most one a second is logged).
  size_t warnings_held_back() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Where the control socket of a run lives: run_dir/control.sock, or a path in
/// fallback_socket_dir() when that would be longer than a UNIX socket path may be.
std::string control_socket_path(const std::string& run_dir);

/// "/tmp/dtrain-<euid>": this user's private folder for control sockets of long run paths. The
/// server makes it (make_private_dir) before binding there.
std::string fallback_socket_dir();

/// Makes dir with mode 0700 unless it exists; throws IoError when it is a symlink or not a
/// folder, belongs to another user, or lets group or others in (mode & 077), since another user
/// could then take or watch the socket.
void make_private_dir(const std::string& dir);

}  // namespace dtrain::launcher
