// Boost.Asio local stream sockets for control_server.h.
#include "launcher/control/control_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <optional>

#include "common/clock.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/unique_fd.h"

namespace dtrain::launcher {
namespace {
using Protocol = boost::asio::local::stream_protocol;

void set_cloexec(int fd) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

struct Connection;
struct PendingReply;

// At most one warning a second, so a flood of junk cannot fill launcher.log (design.md, "Control
// protocol"); the next warning let through says how many were held back.
struct WarningLimiter {
  void warn(const std::string& what, double now) {
    if (now - last < 1.0) {
      ++held_back;
      return;
    }
    if (held_back == 0) {
      spdlog::warn("control socket: {}", what);
    } else {
      spdlog::warn("control socket: {} ({} more warnings held back since the last one)", what,
                   held_back);
    }
    last = now;
    held_back = 0;
  }
  double last = -std::numeric_limits<double>::infinity();  ///< when one was last logged
  size_t held_back = 0;
};

// What the server and its connections share; the server empties the handlers when it goes, so
// connections that outlive it do nothing more.
struct Shared {
  ControlServer::Handler messages;
  ControlServer::RequestHandler requests;
  std::map<std::string, ControlServer::DeferredRequestHandler> deferred;  ///< by request kind
  ControlServer::SenderCheck senders;  ///< empty: every line of this user is taken
  ControlLimits limits;
  std::list<Connection*> open;  ///< every connection not yet closed, oldest first
  size_t live = 0;              ///< connections not yet released, closed or not
  WarningLimiter warnings;
  ControlServer::Clock clock;  ///< seconds; only differences mean anything

  void warn(const std::string& what) { warnings.warn(what, clock()); }
};

struct Connection : std::enable_shared_from_this<Connection> {
  Connection(Protocol::socket s, std::shared_ptr<Shared> sh, int pid)
      : peer_pid(pid),
        socket(std::move(s)),
        idle_timer(socket.get_executor()),
        buffer(sh->limits.max_line_bytes),
        shared(std::move(sh)) {
    shared->open.push_back(this);
    ++shared->live;
  }
  ~Connection() {
    shared->open.remove(this);
    --shared->live;
  }

  void start() {
    touch();
    read_line();
  }

  // Closes the socket; the pending handlers then end and release this connection.
  void close(const char* why) {
    if (closed) return;
    closed = true;
    if (why) shared->warn(fmt::format("closed a connection: {}", why));
    shared->open.remove(this);
    boost::system::error_code ignored;
    socket.close(ignored);
    idle_timer.cancel();
  }

  // Restarts the idle clock: the client sent a line, or took a reply. Never after close(): the
  // timer's handler would hold a closed connection for idle_seconds.
  void touch() {
    if (closed) return;
    last_active = shared->clock();
    idle_timer.expires_after(seconds(shared->limits.idle_seconds));
    idle_timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->close(nullptr);  // silent for too long: nothing to say about it
    });
  }

  void reply(std::string line) {
    queued_bytes += line.size() + 1;
    if (queued_bytes > shared->limits.max_queued_reply_bytes)
      return close("the client does not read its replies");
    replies.push_back(std::move(line) + "\n");
    if (replies.size() == 1) write_next();
  }

  void write_next() {
    boost::asio::async_write(
        socket, boost::asio::buffer(replies.front()),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
          if (ec) return self->close(nullptr);
          self->queued_bytes -= self->replies.front().size();
          self->replies.pop_front();
          self->touch();
          if (!self->replies.empty() && !self->closed) self->write_next();
        });
  }

  // A request has a "request" key; anything else must be a worker's message.
  void dispatch(const std::string& line) {
    if (line.find("\"request\"") != std::string::npos &&
        (shared->requests || !shared->deferred.empty())) {
      try {
        common::JsonDocument doc = common::JsonDocument::parse(line, "request");
        std::string kind = doc.root().at("request").as_string();
        if (auto deferred = shared->deferred.find(kind); deferred != shared->deferred.end()) {
          std::string refusal = sender_refusal(kind, named_task(doc.root()));
          if (!refusal.empty()) {
            return reply(fmt::format("{{\"request\":{},\"ok\":false,\"error\":{}}}",
                                     common::json_quote(kind), common::json_quote(refusal)));
          }
          return defer(deferred->second, doc.root().dump());
        }
        if (!shared->requests)
          throw std::runtime_error("unknown request " + common::json_quote(kind));
        return reply(shared->requests(doc.root().dump()));
      } catch (const std::exception& e) {
        return reply(fmt::format("{{\"ok\":false,\"error\":{}}}", common::json_quote(e.what())));
      }
    }
    if (auto message = common::parse_control_message(line)) {
      if (!sender_refusal("message", message->task).empty()) return;  // logged; no answer
      return shared->messages(*message);
    }
    shared->warn(fmt::format("dropped a malformed message ({} bytes)", line.size()));
    reply("{\"ok\":false,\"error\":\"malformed message\"}");
  }

  // The task a request speaks for: its "task", or a spare's "spare"; "" when it names none.
  static std::string named_task(const common::JsonNode& request) {
    for (const char* key : {"task", "spare"})
      if (auto name = request.find(key); name && name->is_string()) return name->as_string();
    return "";
  }

  // Why this connection's process may not send a kind line for task ("" when it may), logged.
  std::string sender_refusal(const std::string& kind, const std::string& task) {
    if (!shared->senders) return "";
    std::string refusal = shared->senders(kind, task, peer_pid);
    if (!refusal.empty()) {
      shared->warn(fmt::format("refused a {} {} for {} from pid {}: {}", kind,
                               kind == "message" ? "line" : "request", task, peer_pid, refusal));
    }
    return refusal;
  }

  void defer(const ControlServer::DeferredRequestHandler& handler, const std::string& request);

  void read_line() {
    boost::asio::async_read_until(
        socket, buffer, '\n',
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (ec == boost::asio::error::not_found) return self->close("a line over the limit");
          if (ec) return self->close(nullptr);  // peer closed, or closed here
          std::string line(boost::asio::buffers_begin(self->buffer.data()),
                           boost::asio::buffers_begin(self->buffer.data()) + n - 1);
          self->buffer.consume(n);
          if (!self->shared->messages) return;  // the server is gone
          self->touch();
          self->dispatch(line);
          if (!self->closed) self->read_line();
        });
  }

  bool pending_request = false;  ///< a deferred request waits for its reply
  int peer_pid = 0;              ///< SO_PEERCRED's, when it connected; 0 when unknown
  Protocol::socket socket;
  boost::asio::steady_timer idle_timer;
  boost::asio::streambuf buffer;
  std::shared_ptr<Shared> shared;
  std::deque<std::string> replies;  ///< front is being written
  size_t queued_bytes = 0;
  double last_active = 0;  ///< the server's clock when the client last sent or took a line
  bool closed = false;
};

// The one reply of a deferred request. Dropped unanswered, it frees its connection for the next.
struct PendingReply {
  explicit PendingReply(const std::shared_ptr<Connection>& c) : connection(c) {}
  ~PendingReply() {
    if (auto c = connection.lock(); c && !sent) c->pending_request = false;
  }
  void send(std::string line) {
    std::shared_ptr<Connection> c = connection.lock();
    if (sent || !c) return;
    sent = true;
    c->pending_request = false;
    if (c->closed || !c->shared->messages) return;  // closed, or the server is gone
    while (!line.empty() && line.back() == '\n') line.pop_back();
    c->reply(std::move(line));
  }
  std::weak_ptr<Connection> connection;
  bool sent = false;
};

// Hands the request on with a reply that holds this connection weakly: once it is closed, the
// reply does nothing and costs nothing here.
void Connection::defer(const ControlServer::DeferredRequestHandler& handler,
                       const std::string& request) {
  if (pending_request)
    return reply(R"({"ok":false,"error":"a request on this connection is still pending"})");
  pending_request = true;
  auto pending = std::make_shared<PendingReply>(shared_from_this());
  handler(request, [pending](const std::string& line) { pending->send(line); });
}

// The process at the other end (SO_PEERCRED, as it was when it connected); nullopt when the
// kernel does not say.
std::optional<ucred> peer_of(int fd) {
  ucred peer{};
  socklen_t length = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) return std::nullopt;
  return peer;
}

}  // namespace

struct ControlServer::Impl {
  Impl(boost::asio::io_context& io, std::string p, Handler h, RequestHandler r, ControlLimits l,
       Clock c)
      : path(std::move(p)),
        shared(
            std::make_shared<Shared>(Shared{std::move(h),
                                            std::move(r),
                                            {},
                                            {},
                                            l,
                                            {},
                                            0,
                                            {},
                                            c ? std::move(c) : Clock(common::monotonic_seconds)})),
        acceptor(io),
        pause(io) {}

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, Protocol::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (ec) return pause_accepting(ec);
      // Only processes of this user may talk to the launcher.
      std::optional<ucred> peer = peer_of(socket.native_handle());
      if (!peer || peer->uid != ::geteuid()) {
        shared->warn("refused a connection from another user");
      } else {
        set_cloexec(socket.native_handle());
        make_room();
        std::make_shared<Connection>(std::move(socket), shared, peer->pid)->start();
      }
      accept();
    });
  }

  // accept() fails again at once while its cause lasts (no descriptor left): wait, then retry.
  void pause_accepting(const boost::system::error_code& ec) {
    if (shared->clock() - last_pause_logged > 10) {
      spdlog::warn("control socket: cannot accept a connection ({}); pausing {:.1f} s",
                   ec.message(), shared->limits.accept_pause_seconds);
      last_pause_logged = shared->clock();
    }
    pause.expires_after(seconds(shared->limits.accept_pause_seconds));
    pause.async_wait([this](const boost::system::error_code& timer_ec) {
      if (!timer_ec) accept();
    });
  }

  // All connections taken: the one idle longest goes (a worker's client reconnects by itself).
  void make_room() {
    if (shared->open.size() < shared->limits.max_connections) return;
    auto idlest = std::min_element(
        shared->open.begin(), shared->open.end(),
        [](const Connection* a, const Connection* b) { return a->last_active < b->last_active; });
    (*idlest)->close("too many connections; this one was idle longest");
  }

  std::string path;
  std::shared_ptr<Shared> shared;
  Protocol::acceptor acceptor;
  boost::asio::steady_timer pause;
  double last_pause_logged = -std::numeric_limits<double>::infinity();
};

ControlServer::ControlServer(boost::asio::io_context& io, std::string path, Handler handler,
                             RequestHandler requests, ControlLimits limits, Clock clock)
    : impl_(std::make_unique<Impl>(io, std::move(path), std::move(handler), std::move(requests),
                                   limits, std::move(clock))) {
  std::string folder = impl_->path.substr(0, impl_->path.rfind('/'));
  if (folder == fallback_socket_dir()) make_private_dir(folder);
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
  impl_->shared->messages = nullptr;
  impl_->shared->requests = nullptr;
  impl_->shared->deferred.clear();
  impl_->shared->senders = nullptr;
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->pause.cancel();
  ::unlink(impl_->path.c_str());
}

void ControlServer::defer(const std::string& kind, DeferredRequestHandler handler) {
  impl_->shared->deferred[kind] = std::move(handler);
}

void ControlServer::check_senders(SenderCheck check) {
  impl_->shared->senders = std::move(check);
}

std::string ControlServer::address() const {
  return common::kControlScheme + impl_->path;
}

size_t ControlServer::open_connections() const {
  return impl_->shared->open.size();
}

size_t ControlServer::live_connections() const {
  return impl_->shared->live;
}

size_t ControlServer::warnings_held_back() const {
  return impl_->shared->warnings.held_back;
}

std::string fallback_socket_dir() {
  return fmt::format("/tmp/dtrain-{}", ::geteuid());
}

void make_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw common::IoError(fmt::format("cannot create {}: {}", dir, std::strerror(errno)));
  // O_NOFOLLOW: a symlink planted there by someone else is refused, not followed.
  common::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat info {};
  if (!fd.valid() || ::fstat(fd.get(), &info) != 0) {
    throw common::IoError(fmt::format("{} is not a directory (a symlink?): {}; remove it", dir,
                                      std::strerror(errno)));
  }
  if (info.st_uid != ::geteuid()) {
    throw common::IoError(fmt::format(
        "{} belongs to uid {}, not to this user (uid {}): another user may be waiting for "
        "this launcher's control socket there; remove it, or use a shorter --run-dir",
        dir, info.st_uid, ::geteuid()));
  }
  if ((info.st_mode & 0077) != 0) {
    throw common::IoError(
        fmt::format("{} has mode {:o}: others may enter it and take the control socket; remove it "
                    "or chmod 700 it",
                    dir, info.st_mode & 0777));
  }
}

std::string control_socket_path(const std::string& run_dir) {
  std::string path = run_dir + "/control.sock";
  if (path.size() < sizeof(sockaddr_un{}.sun_path)) return path;
  return fmt::format("{}/{:016x}.sock", fallback_socket_dir(), std::hash<std::string>{}(run_dir));
}

}  // namespace dtrain::launcher
