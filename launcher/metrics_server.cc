// See metrics_server.h.
#include "launcher/metrics_server.h"

#include <fmt/format.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include "common/errors.h"

namespace dtrain::launcher {
namespace {
using boost::asio::ip::tcp;

struct Exchange : std::enable_shared_from_this<Exchange> {
  Exchange(tcp::socket s, const std::function<std::string()>& r)
      : socket(std::move(s)), timer(socket.get_executor()), request(8192), render(r) {}

  void start() {
    timer.expires_after(std::chrono::seconds(2));
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->socket.close();
    });
    boost::asio::async_read_until(
        socket, request, "\r\n\r\n",
        [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
          if (ec) return;
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
                               self->timer.cancel();
                             });
  }

  tcp::socket socket;
  boost::asio::steady_timer timer;
  boost::asio::streambuf request;
  std::string response;
  std::function<std::string()> render;
};

}  // namespace

struct MetricsServer::Impl {
  Impl(boost::asio::io_context& io, std::function<std::string()> r)
      : acceptor(io), render(std::move(r)) {}
  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (!ec) std::make_shared<Exchange>(std::move(socket), render)->start();
      accept();
    });
  }
  tcp::acceptor acceptor;
  std::function<std::string()> render;
};

MetricsServer::MetricsServer(boost::asio::io_context& io, int port,
                             std::function<std::string()> render)
    : impl_(std::make_unique<Impl>(io, std::move(render))) {
  boost::system::error_code ec;
  tcp::endpoint endpoint(boost::asio::ip::make_address("127.0.0.1"),
                         static_cast<unsigned short>(port));
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(16, ec);
  if (ec)
    throw common::ConfigError(fmt::format("--metrics-port {}: cannot listen on 127.0.0.1:{}: {}",
                                          port, port, ec.message()));
  impl_->accept();
}

MetricsServer::~MetricsServer() {
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

}  // namespace dtrain::launcher
