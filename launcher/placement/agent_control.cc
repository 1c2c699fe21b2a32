// See agent_control.h.
#include "launcher/placement/agent_control.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "common/control_protocol.h"
#include "common/errors.h"
#include "common/json.h"

namespace dtrain::launcher {
namespace {

constexpr size_t kMaxConnections = 32;
constexpr size_t kMaxUnsentBytes = 4 << 20;  ///< replies a connection has not read
constexpr const char* kSocketName = "/control.sock";

// A fresh 0700 folder under $TMPDIR, or /tmp when that path would not fit a UNIX socket path.
std::string make_private_folder() {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  std::string pattern = base + "/dtrain-agent-XXXXXX";
  if (pattern.size() + std::strlen(kSocketName) >= sizeof(sockaddr_un{}.sun_path))
    pattern = "/tmp/dtrain-agent-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw common::IoError(
        fmt::format("agent: cannot create a folder {}: {}", pattern, std::strerror(errno)));
  }
  return pattern;
}

// The compact JSON of a line that is a request waiting for the launcher's answer: an object whose
// "request" is "reform", "spare" or "sigterm" (common/control_protocol.h); nullopt for any other
// line.
std::optional<std::string> waiting_request(std::string_view line) {
  try {
    common::JsonDocument doc = common::JsonDocument::parse(line, "control line");
    common::JsonNode root = doc.root();
    if (!root.is_object()) return std::nullopt;
    std::optional<common::JsonNode> kind = root.find("request");
    if (!kind || !kind->is_string()) return std::nullopt;
    std::string name = kind->as_string();
    if (name != "reform" && name != "spare" && name != "sigterm") return std::nullopt;
    return root.dump();
  } catch (const common::ConfigError&) {
    return std::nullopt;
  }
}

bool same_user(int fd) {
  ucred peer{};
  socklen_t size = sizeof peer;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) == 0 && peer.uid == ::getuid();
}

}  // namespace

AgentControlSocket::AgentControlSocket()
    : folder_(make_private_folder()), path_(folder_ + kSocketName) {
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  if (!listener_.valid() ||
      ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::chmod(path_.c_str(), 0600) != 0 || ::listen(listener_.get(), 16) != 0) {
    int error = errno;
    listener_.reset();
    ::unlink(path_.c_str());
    ::rmdir(folder_.c_str());
    throw common::IoError(
        fmt::format("agent: cannot listen on {}: {}", path_, std::strerror(error)));
  }
}

AgentControlSocket::~AgentControlSocket() {
  connections_.clear();
  listener_.reset();
  ::unlink(path_.c_str());
  for (const std::string& path : private_paths_) ::unlink(path.c_str());
  ::rmdir(folder_.c_str());
}

std::string AgentControlSocket::address() const {
  return common::kControlScheme + path_;
}

std::string AgentControlSocket::private_path(const std::string& name) {
  private_paths_.push_back(folder_ + "/" + name);
  return private_paths_.back();
}

size_t AgentControlSocket::add_poll_fds(std::vector<pollfd>& fds) const {
  fds.push_back({listener_.get(), POLLIN, 0});
  for (const Connection& c : connections_) {
    short events = c.unsent.empty() ? POLLIN : POLLIN | POLLOUT;
    fds.push_back({c.fd.get(), events, 0});
  }
  return 1 + connections_.size();
}

void AgentControlSocket::handle(const pollfd* ready, size_t count, const Handlers& handlers) {
  // Connections first: their indices match ready[1..] only until accept adds more.
  for (size_t i = count - 1; i >= 1; --i) {
    short revents = ready[i].revents;
    if (revents == 0) continue;
    Connection& connection = connections_[i - 1];
    bool keep = true;
    if ((revents & POLLOUT) != 0) keep = write_unsent(connection);
    if (keep && (revents & ~POLLOUT) != 0) keep = read_lines(connection, handlers);
    if (!keep) connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i - 1));
  }
  if (ready[0].revents != 0) accept_connections();
}

bool AgentControlSocket::reply(uint64_t id, std::string_view line) {
  for (Connection& c : connections_) {
    auto request = std::find(c.requests.begin(), c.requests.end(), id);
    if (request == c.requests.end()) continue;
    c.requests.erase(request);
    c.unsent.append(line).push_back('\n');
    // A broken or stuck connection is shut down here and erased when handle() reads its end:
    // the caller may hold poll entries that count on connections_ staying as it is.
    if (c.unsent.size() > kMaxUnsentBytes || !write_unsent(c)) {
      c.unsent.clear();
      ::shutdown(c.fd.get(), SHUT_RDWR);
    }
    return true;
  }
  return false;
}

size_t AgentControlSocket::open_requests() const {
  size_t open = 0;
  for (const Connection& c : connections_) open += c.requests.size();
  return open;
}

void AgentControlSocket::accept_connections() {
  while (true) {
    common::UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) return;  // EAGAIN: no more waiting (other errors: the next poll retries)
    if (connections_.size() < kMaxConnections && same_user(fd.get()))
      connections_.push_back({std::move(fd), {}, {}, {}});
  }
}

bool AgentControlSocket::read_lines(Connection& connection, const Handlers& handlers) {
  char chunk[16 * 1024];
  ssize_t n = ::read(connection.fd.get(), chunk, sizeof chunk);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return false;
  connection.buffer.append(chunk, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t end; (end = connection.buffer.find('\n', start)) != std::string::npos;
       start = end + 1) {
    std::string_view line(connection.buffer.data() + start, end - start);
    if (!handle_line(connection, line, handlers)) return false;
  }
  connection.buffer.erase(0, start);
  return connection.buffer.size() <= common::kMaxControlLine;
}

bool AgentControlSocket::handle_line(Connection& connection, std::string_view line,
                                     const Handlers& handlers) {
  if (line.find("\"request\"") != std::string_view::npos) {
    if (std::optional<std::string> json = waiting_request(line)) {
      if (open_requests() >= kMaxOpenRequests) return false;
      uint64_t id = next_request_id_++;
      connection.requests.push_back(id);
      handlers.request(id, *json);
      return true;
    }
  }
  if (auto message = common::parse_control_message(line)) {
    std::string canonical = common::format_control_message(*message);  // no stray '\r'
    handlers.message(std::string_view(canonical).substr(0, canonical.size() - 1));
  }
  return true;
}

bool AgentControlSocket::write_unsent(Connection& connection) {
  while (!connection.unsent.empty()) {
    ssize_t n = ::send(connection.fd.get(), connection.unsent.data(), connection.unsent.size(),
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      connection.unsent.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return n < 0 && errno == EAGAIN;  // the rest when poll() says the socket takes more
    }
  }
  return true;
}

}  // namespace dtrain::launcher
