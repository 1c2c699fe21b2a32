// See metrics_server.h.
#include "launcher/view/metrics_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <list>

#include "common/errors.h"

namespace dtrain::launcher {
namespace {
using boost::asio::ip::tcp;

struct Exchange;
using OpenExchanges = std::list<Exchange*>;  ///< not yet finished, oldest first

// One client: its request (up to 8 KiB, ending in a blank line), one response, then closed; the
// whole exchange gets client_seconds.
struct Exchange : std::enable_shared_from_this<Exchange> {
  Exchange(tcp::socket s, const std::function<std::string()>& r, std::shared_ptr<OpenExchanges> all)
      : socket(std::move(s)),
        timer(socket.get_executor()),
        request(8192),
        render(r),
        open(std::move(all)) {
    open->push_back(this);
  }
  ~Exchange() { finish(); }

  void start(double client_seconds) {
    timer.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(client_seconds)));
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->finish();
    });
    boost::asio::async_read_until(
        socket, request, "\r\n\r\n",
        [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
          if (ec || self->finished) return self->finish();
          self->answer();
        });
  }
  void answer() {
    std::string body = render();
    response = fmt::format(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n"
        "Connection: close\r\n\r\n{}",
        body.size(), body);
    boost::asio::async_write(socket, boost::asio::buffer(response),
                             [self = shared_from_this()](const boost::system::error_code&, size_t) {
                               boost::system::error_code ignored;
                               self->socket.shutdown(tcp::socket::shutdown_both, ignored);
                               self->finish();
                             });
  }
  // Closes the socket at once (its descriptor is given back now, not when the handlers end).
  void finish() {
    if (finished) return;
    finished = true;
    open->remove(this);
    boost::system::error_code ignored;
    socket.close(ignored);
    timer.cancel();
  }

  tcp::socket socket;
  boost::asio::steady_timer timer;
  boost::asio::streambuf request;
  std::string response;
  std::function<std::string()> render;
  std::shared_ptr<OpenExchanges> open;
  bool finished = false;
};

}  // namespace

struct MetricsServer::Impl {
  Impl(boost::asio::io_context& io, std::function<std::string()> r, double seconds)
      : acceptor(io), pause(io), render(std::move(r)), client_seconds(seconds) {}
  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (ec) return pause_accepting();
      ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);  // a worker started now
      // A flood of connections must not take the launcher's descriptors (issue 25): the oldest
      // exchange gives way to the newest.
      if (open->size() >= kMaxMetricsConnections) open->front()->finish();
      std::make_shared<Exchange>(std::move(socket), render, open)->start(client_seconds);
      accept();
    });
  }
  // accept() fails again at once while its cause lasts (no descriptor left): wait, then retry.
  void pause_accepting() {
    pause.expires_after(std::chrono::milliseconds(200));
    pause.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) accept();
    });
  }
  tcp::acceptor acceptor;
  boost::asio::steady_timer pause;
  std::function<std::string()> render;
  double client_seconds;
  std::shared_ptr<OpenExchanges> open = std::make_shared<OpenExchanges>();
};

common::UniqueFd listen_for_metrics(int port) {
  if (port < 1 || port > 65535)
    throw common::ConfigError(fmt::format("--metrics-port {}: not a TCP port (1-65535)", port));
  common::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  bool ok = fd.valid() && ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
            ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
            ::listen(fd.get(), 16) == 0;
  if (!ok) {
    throw common::ConfigError(fmt::format("--metrics-port {}: cannot listen on 127.0.0.1:{}: {}",
                                          port, port, std::strerror(errno)));
  }
  return fd;
}

MetricsServer::MetricsServer(boost::asio::io_context& io, common::UniqueFd listener,
                             std::function<std::string()> render, double client_seconds)
    : impl_(std::make_unique<Impl>(io, std::move(render), client_seconds)) {
  boost::system::error_code ec;
  impl_->acceptor.assign(tcp::v4(), listener.get(), ec);
  if (ec) throw common::IoError(fmt::format("metrics server: {}", ec.message()));
  listener.release();  // the acceptor owns it now
  impl_->accept();
}

MetricsServer::~MetricsServer() {
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->pause.cancel();
  while (!impl_->open->empty()) impl_->open->front()->finish();
}

size_t MetricsServer::open_connections() const {
  return impl_->open->size();
}

}  // namespace dtrain::launcher
