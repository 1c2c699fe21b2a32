// Boost.Asio local stream sockets for control_server.h.
#include "launcher/control_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <functional>

#include "common/errors.h"
#include "common/json.h"

namespace dtrain::launcher {
namespace {
using Protocol = boost::asio::local::stream_protocol;

void set_cloexec(int fd) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

struct Handlers {
  ControlServer::Handler messages;
  ControlServer::RequestHandler requests;
};

struct Connection : std::enable_shared_from_this<Connection> {
  Connection(Protocol::socket s, std::shared_ptr<Handlers> h)
      : socket(std::move(s)), buffer(common::kMaxControlLine), handler(std::move(h)) {}

  void reply(std::string line) {
    auto text = std::make_shared<std::string>(std::move(line) + "\n");
    boost::asio::async_write(
        socket, boost::asio::buffer(*text),
        [self = shared_from_this(), text](const boost::system::error_code&, size_t) {});
  }

  // A request has a "request" key; anything else must be a worker's message.
  void dispatch(const std::string& line) {
    if (line.find("\"request\"") != std::string::npos && handler->requests) {
      try {
        common::JsonDocument doc = common::JsonDocument::parse(line, "request");
        doc.root().at("request").as_string();
        return reply(handler->requests(doc.root().dump()));
      } catch (const std::exception& e) {
        return reply(fmt::format("{{\"ok\":false,\"error\":{}}}", common::json_quote(e.what())));
      }
    }
    if (auto message = common::parse_control_message(line)) return handler->messages(*message);
    spdlog::warn("control socket: dropped a malformed message ({} bytes)", line.size());
    reply("{\"ok\":false,\"error\":\"malformed message\"}");
  }

  void read_line() {
    boost::asio::async_read_until(
        socket, buffer, '\n',
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (ec) return;  // peer closed, or the line outgrew kMaxControlLine
          std::string line(boost::asio::buffers_begin(self->buffer.data()),
                           boost::asio::buffers_begin(self->buffer.data()) + n - 1);
          self->buffer.consume(n);
          if (!self->handler->messages) return;  // the server is gone
          self->dispatch(line);
          self->read_line();
        });
  }

  Protocol::socket socket;
  boost::asio::streambuf buffer;
  std::shared_ptr<Handlers> handler;  // emptied when the server goes
};

// Only processes of this user may talk to the launcher.
bool same_user(int fd) {
  ucred peer{};
  socklen_t length = sizeof peer;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && peer.uid == ::geteuid();
}

}  // namespace

struct ControlServer::Impl {
  Impl(boost::asio::io_context& io, std::string p, Handler h, RequestHandler r)
      : path(std::move(p)),
        handler(std::make_shared<Handlers>(Handlers{std::move(h), std::move(r)})),
        acceptor(io) {}

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, Protocol::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (!ec && !same_user(socket.native_handle())) {
        spdlog::warn("control socket: refused a connection from another user");
      } else if (!ec) {
        set_cloexec(socket.native_handle());
        std::make_shared<Connection>(std::move(socket), handler)->read_line();
      }
      accept();
    });
  }

  std::string path;
  std::shared_ptr<Handlers> handler;
  Protocol::acceptor acceptor;
};

ControlServer::ControlServer(boost::asio::io_context& io, std::string path, Handler handler,
                             RequestHandler requests)
    : impl_(std::make_unique<Impl>(io, std::move(path), std::move(handler), std::move(requests))) {
  ::unlink(impl_->path.c_str());
  boost::system::error_code ec;
  impl_->acceptor.open(Protocol(), ec);
  if (!ec) set_cloexec(impl_->acceptor.native_handle());
  if (!ec) impl_->acceptor.bind(Protocol::endpoint(impl_->path), ec);
  if (!ec && ::chmod(impl_->path.c_str(), 0600) != 0)
    ec.assign(errno, boost::system::system_category());
  if (!ec) impl_->acceptor.listen(64, ec);
  if (ec) throw common::IoError(fmt::format("control socket {}: {}", impl_->path, ec.message()));
  impl_->accept();
}

ControlServer::~ControlServer() {
  impl_->handler->messages = nullptr;
  impl_->handler->requests = nullptr;
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
