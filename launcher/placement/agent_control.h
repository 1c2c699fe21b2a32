// The agent's end of DTRAIN_CONTROL: a UNIX socket in a private folder (0700, under $TMPDIR or
// /tmp) that the worker's ControlClient connects to. Lines that parse as control messages are
// handed on, re-written compactly on one line; a request that waits for the launcher's answer
// ({"request": "reform" or "spare", ...}) is handed on with an id and its connection kept until
// reply() answers it. Malformed lines are dropped, an overlong one closes its connection, and only
// this user may connect. It does not answer requests itself (`dtrain status` talks to the
// launcher). Driven by the agent's poll() loop on one thread; nothing here blocks.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"

namespace dtrain::launcher {

class AgentControlSocket {
 public:
  /// What handle() found on the connections; json is one compact line, without newline.
  struct Handlers {
    std::function<void(std::string_view json)> message;  ///< a control message
    /// A request waiting for reply(id, ...) on the connection it came on.
    std::function<void(uint64_t id, std::string_view json)> request;
  };
  /// Requests waiting for a reply, over all connections; a request beyond this closes its
  /// connection (the worker sees no answer at once rather than none ever).
  static constexpr size_t kMaxOpenRequests = 64;

  /// Creates the folder and listens. Throws IoError naming the path.
  AgentControlSocket();
  /// Closes every connection and removes the socket, every private_path() and the folder.
  ~AgentControlSocket();
  AgentControlSocket(const AgentControlSocket&) = delete;
  AgentControlSocket& operator=(const AgentControlSocket&) = delete;

  /// "unix:<path>", the worker's DTRAIN_CONTROL.
  std::string address() const;
  const std::string& folder() const { return folder_; }
  /// "<folder>/<name>" for a file the worker writes there (its progress record); the destructor
  /// removes it.
  std::string private_path(const std::string& name);

  /// Appends the descriptors to watch (listening socket, then connections); returns how many.
  size_t add_poll_fds(std::vector<pollfd>& fds) const;
  /// Handles the entries that add_poll_fds appended (ready: a pointer to the first of them).
  void handle(const pollfd* ready, size_t count, const Handlers& handlers);
  /// Writes line and a newline to the connection that request id came on, and forgets the id.
  /// False (nothing written) when the id is not waiting: its connection has closed, it was
  /// answered already, or never given. Never blocks: what the socket does not take at once is
  /// written when poll() says it can be; a connection that breaks meanwhile is closed.
  bool reply(uint64_t id, std::string_view line);
  /// Requests waiting for a reply.
  size_t open_requests() const;

 private:
  struct Connection {
    common::UniqueFd fd;
    std::string buffer;              ///< an unfinished line
    std::vector<uint64_t> requests;  ///< ids waiting for a reply on this connection
    std::string unsent;              ///< reply bytes the socket has not taken yet
  };
  void accept_connections();
  /// False when the connection should close.
  bool read_lines(Connection& connection, const Handlers& handlers);
  /// False when the line was a request that cannot be kept (the connection should close).
  bool handle_line(Connection& connection, std::string_view line, const Handlers& handlers);
  /// False when the connection broke.
  bool write_unsent(Connection& connection);

  std::string folder_;
  std::string path_;
  common::UniqueFd listener_;
  std::vector<Connection> connections_;
  std::vector<std::string> private_paths_;
  uint64_t next_request_id_ = 1;
};

}  // namespace dtrain::launcher
