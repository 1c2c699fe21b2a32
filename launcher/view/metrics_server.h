// An opt-in Prometheus endpoint: plain HTTP on 127.0.0.1:PORT answering any request with the
// text the callback returns (Prometheus's text format 0.0.4). On the launcher's io_context; a
// client gets at most 2 s for the whole exchange, and at most 16 are served at once (the oldest
// is closed for a new one), so a flood of connections cannot take the launcher's descriptors. The
// listening socket is made before the launcher detaches (a busy port is then the launching
// command's error) and, like every socket it accepts, is close-on-exec so workers never hold it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/unique_fd.h"

namespace boost::asio {
class io_context;
}

namespace dtrain::launcher {

/// Clients served at once; a new one beyond this closes the oldest.
inline constexpr size_t kMaxMetricsConnections = 16;
/// Seconds a client has to send its request and take the response (the launcher's; a test may
/// give the server another).
inline constexpr double kMetricsClientSeconds = 2;

/// A listening socket on 127.0.0.1:port, close-on-exec. Throws ConfigError naming the port when
/// it is not a TCP port (1-65535) or cannot be bound (e.g. in use).
common::UniqueFd listen_for_metrics(int port);

class MetricsServer {
 public:
  /// Serves on listener (from listen_for_metrics), which it takes; each client gets
  /// client_seconds for its whole exchange.
  MetricsServer(boost::asio::io_context& io, common::UniqueFd listener,
                std::function<std::string()> render, double client_seconds = kMetricsClientSeconds);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// Clients being served now (at most kMaxMetricsConnections).
  size_t open_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::launcher
