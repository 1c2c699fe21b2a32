// An opt-in Prometheus endpoint: plain HTTP on 127.0.0.1:PORT answering any request with the
// text the callback returns (Prometheus's text format 0.0.4). On the launcher's io_context; a
// client gets at most 2 s to send its request.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace dtrain::launcher {

class MetricsServer {
 public:
  /// Listens on 127.0.0.1:port. Throws ConfigError naming the port when it cannot bind.
  MetricsServer(boost::asio::io_context& io, int port, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::launcher
