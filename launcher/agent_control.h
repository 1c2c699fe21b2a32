// The agent's end of DTRAIN_CONTROL: a UNIX socket in a private folder (0700, under $TMPDIR or
// /tmp) that the worker's ControlClient connects to. Lines that parse as control messages are
// handed on, re-written compactly on one line; malformed ones are dropped, an overlong one closes
// its connection, and only this user may connect. It does not answer requests (`dtrain status`
// talks to the launcher). Driven by the agent's poll() loop on one thread; nothing here blocks.
#pragma once

#include <poll.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"

namespace dtrain::launcher {

class AgentControlSocket {
 public:
  using LineHandler = std::function<void(std::string_view json)>;  ///< without newline

  /// Creates the folder and listens. Throws IoError naming the path.
  AgentControlSocket();
  /// Closes every connection and removes the socket and the folder.
  ~AgentControlSocket();
  AgentControlSocket(const AgentControlSocket&) = delete;
  AgentControlSocket& operator=(const AgentControlSocket&) = delete;

  /// "unix:<path>", the worker's DTRAIN_CONTROL.
  std::string address() const;
  const std::string& folder() const { return folder_; }

  /// Appends the descriptors to watch (listening socket, then connections); returns how many.
  size_t add_poll_fds(std::vector<pollfd>& fds) const;
  /// Handles the entries that add_poll_fds appended (ready: a pointer to the first of them).
  void handle(const pollfd* ready, size_t count, const LineHandler& on_line);

 private:
  struct Connection {
    common::UniqueFd fd;
    std::string buffer;
  };
  void accept_connections();
  /// False when the connection should close.
  bool read_lines(Connection& connection, const LineHandler& on_line);

  std::string folder_;
  std::string path_;
  common::UniqueFd listener_;
  std::vector<Connection> connections_;
};

}  // namespace dtrain::launcher
