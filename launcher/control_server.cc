// Boost.Asio local stream sockets for control_server.h.
#include "launcher/control_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <functional>

#include "common/errors.h"

namespace dtrain::launcher {
namespace {
using Protocol = boost::asio::local::stream_protocol;

void set_cloexec(int fd) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

struct Connection : std::enable_shared_from_this<Connection> {
  Connection(Protocol::socket s, std::shared_ptr<ControlServer::Handler> h)
      : socket(std::move(s)), buffer(common::kMaxControlLine), handler(std::move(h)) {}

  void read_line() {
    boost::asio::async_read_until(
        socket, buffer, '\n',
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (ec) return;  // peer closed, or the line outgrew kMaxControlLine
          std::string line(boost::asio::buffers_begin(self->buffer.data()),
                           boost::asio::buffers_begin(self->buffer.data()) + n - 1);
          self->buffer.consume(n);
          if (!*self->handler) return;  // the server is gone
          if (auto message = common::parse_control_message(line)) {
            (*self->handler)(*message);
          } else {
            spdlog::warn("control socket: dropped a malformed message ({} bytes)", line.size());
          }
          self->read_line();
        });
  }

  Protocol::socket socket;
  boost::asio::streambuf buffer;
  std::shared_ptr<ControlServer::Handler> handler;  // emptied when the server goes
};

}  // namespace

struct ControlServer::Impl {
  Impl(boost::asio::io_context& io, std::string p, Handler h)
      : path(std::move(p)), handler(std::make_shared<Handler>(std::move(h))), acceptor(io) {}

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, Protocol::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (!ec) {
        set_cloexec(socket.native_handle());
        std::make_shared<Connection>(std::move(socket), handler)->read_line();
      }
      accept();
    });
  }

  std::string path;
  std::shared_ptr<Handler> handler;
  Protocol::acceptor acceptor;
};

ControlServer::ControlServer(boost::asio::io_context& io, std::string path, Handler handler)
    : impl_(std::make_unique<Impl>(io, std::move(path), std::move(handler))) {
  ::unlink(impl_->path.c_str());
  boost::system::error_code ec;
  impl_->acceptor.open(Protocol(), ec);
  if (!ec) set_cloexec(impl_->acceptor.native_handle());
  if (!ec) impl_->acceptor.bind(Protocol::endpoint(impl_->path), ec);
  if (!ec) impl_->acceptor.listen(64, ec);
  if (ec) throw common::IoError(fmt::format("control socket {}: {}", impl_->path, ec.message()));
  impl_->accept();
}

ControlServer::~ControlServer() {
  *impl_->handler = nullptr;
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  ::unlink(impl_->path.c_str());
}

std::string ControlServer::address() const {
  return common::kControlScheme + impl_->path;
}

std::string control_socket_path(const std::string& run_dir) {
  std::string path = run_dir + "/control.sock";
  if (path.size() < sizeof(sockaddr_un{}.sun_path)) return path;
  return fmt::format("/tmp/dtrain-{}-{:016x}.sock", ::getuid(), std::hash<std::string>{}(run_dir));
}

}  // namespace dtrain::launcher
