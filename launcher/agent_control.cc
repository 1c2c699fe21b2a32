// See agent_control.h.
#include "launcher/agent_control.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/control_protocol.h"
#include "common/errors.h"

namespace dtrain::launcher {
namespace {

constexpr size_t kMaxConnections = 32;
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
  ::rmdir(folder_.c_str());
}

std::string AgentControlSocket::address() const {
  return common::kControlScheme + path_;
}

size_t AgentControlSocket::add_poll_fds(std::vector<pollfd>& fds) const {
  fds.push_back({listener_.get(), POLLIN, 0});
  for (const Connection& c : connections_) fds.push_back({c.fd.get(), POLLIN, 0});
  return 1 + connections_.size();
}

void AgentControlSocket::handle(const pollfd* ready, size_t count, const LineHandler& on_line) {
  // Connections first: their indices match ready[1..] only until accept adds more.
  for (size_t i = count - 1; i >= 1; --i) {
    if (ready[i].revents == 0) continue;
    if (!read_lines(connections_[i - 1], on_line))
      connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i - 1));
  }
  if (ready[0].revents != 0) accept_connections();
}

void AgentControlSocket::accept_connections() {
  while (true) {
    common::UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) return;  // EAGAIN: no more waiting (other errors: the next poll retries)
    if (connections_.size() < kMaxConnections && same_user(fd.get()))
      connections_.push_back({std::move(fd), {}});
  }
}

bool AgentControlSocket::read_lines(Connection& connection, const LineHandler& on_line) {
  char chunk[16 * 1024];
  ssize_t n = ::read(connection.fd.get(), chunk, sizeof chunk);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return false;
  connection.buffer.append(chunk, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t end; (end = connection.buffer.find('\n', start)) != std::string::npos;
       start = end + 1) {
    std::string_view line(connection.buffer.data() + start, end - start);
    if (auto message = common::parse_control_message(line)) {
      std::string canonical = common::format_control_message(*message);  // no stray '\r'
      on_line(std::string_view(canonical).substr(0, canonical.size() - 1));
    }
  }
  connection.buffer.erase(0, start);
  return connection.buffer.size() <= common::kMaxControlLine;
}

}  // namespace dtrain::launcher
