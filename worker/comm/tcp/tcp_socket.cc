// See tcp_socket.h.
#include "worker/comm/tcp/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/clock.h"
#include "common/errors.h"

namespace dtrain::comm {
namespace {

constexpr int kSocketBufferBytes = 4 << 20;

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

int resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  return ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &out.list);
}

// Waits until fd is ready for events or the deadline passes; false on deadline.
bool wait_ready(int fd, short events, const Deadline& deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.poll_ms());
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the I/O call report it
    if (deadline.expired()) return false;
  }
}

void read_exact(int fd, unsigned char* out, size_t length, const Deadline& deadline,
                const std::string& peer) {
  size_t done = 0;
  while (done < length) {
    ssize_t n = ::recv(fd, out + done, length - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      throw common::IoError(fmt::format("{}: connection closed", peer));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!wait_ready(fd, POLLIN, deadline)) {
        throw common::IoError(fmt::format("{}: timed out after {:.0f} s waiting for {}", peer,
                                          deadline.seconds(), deadline.what()));
      }
    } else {
      throw common::IoError(fmt::format("{}: {}", peer, std::strerror(errno)));
    }
  }
}

}  // namespace

Deadline::Deadline(double seconds_from_now, std::string what)
    : at_(common::monotonic_seconds() + seconds_from_now),
      seconds_(seconds_from_now),
      what_(std::move(what)) {}

bool Deadline::expired() const {
  return common::monotonic_seconds() >= at_;
}

int Deadline::poll_ms(int cap_ms) const {
  double left = (at_ - common::monotonic_seconds()) * 1000;
  return static_cast<int>(std::clamp(left, 0.0, static_cast<double>(cap_ms)));
}

common::UniqueFd listen_on(const std::string& host, int port, double busy_seconds) {
  AddrInfo found;
  int rc = resolve(host, port, true, found);
  if (rc != 0)
    throw common::IoError(fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc)));
  const double give_up = common::monotonic_seconds() + busy_seconds;
  while (true) {
    std::string error = "no address";
    bool busy = false;
    for (addrinfo* a = found.list; a != nullptr; a = a->ai_next) {
      common::UniqueFd fd(
          ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd.valid()) continue;
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 64) == 0)
        return fd;
      busy = busy || errno == EADDRINUSE;
      error = std::strerror(errno);
    }
    if (!busy || common::monotonic_seconds() >= give_up)
      throw common::IoError(fmt::format("cannot listen on {}:{}: {}", host, port, error));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

common::UniqueFd connect_once(const std::string& host, int port, double timeout_seconds,
                              std::string& error) {
  AddrInfo found;
  int rc = resolve(host, port, false, found);
  if (rc != 0) {
    error = fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc));
    return {};
  }
  for (addrinfo* a = found.list; a != nullptr; a = a->ai_next) {
    common::UniqueFd fd(
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd.valid()) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = std::strerror(errno);
      continue;
    }
    if (!wait_ready(fd.get(), POLLOUT, Deadline(timeout_seconds, "connect"))) {
      error = "connect timed out";
      continue;
    }
    int so_error = 0;
    socklen_t length = sizeof so_error;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &length);
    if (so_error == 0) {
      tune_socket(fd.get());
      return fd;
    }
    error = std::strerror(so_error);
  }
  return {};
}

void tune_socket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBufferBytes, sizeof kSocketBufferBytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSocketBufferBytes, sizeof kSocketBufferBytes);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  set_nonblocking(fd);
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return "unknown peer";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
  } else {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

void write_frame(int fd, FrameType type, const void* payload, size_t length,
                 const Deadline& deadline, const std::string& peer) {
  unsigned char header[kFrameHeaderBytes];
  encode_header({type, static_cast<uint32_t>(length)}, header);
  std::string bytes(reinterpret_cast<const char*>(header), kFrameHeaderBytes);
  bytes.append(static_cast<const char*>(payload), length);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n >= 0) {
      done += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!wait_ready(fd, POLLOUT, deadline)) {
        throw common::IoError(fmt::format("{}: timed out after {:.0f} s sending {}", peer,
                                          deadline.seconds(), deadline.what()));
      }
    } else {
      throw common::IoError(fmt::format("{}: {}", peer, std::strerror(errno)));
    }
  }
}

std::vector<unsigned char> read_frame(int fd, FrameType expected, const Deadline& deadline,
                                      const std::string& peer) {
  unsigned char raw[kFrameHeaderBytes];
  read_exact(fd, raw, kFrameHeaderBytes, deadline, peer);
  FrameHeader header = decode_header(raw);
  std::string problem = check_header(header);
  if (!problem.empty()) throw common::IoError(fmt::format("{}: bad frame: {}", peer, problem));
  // The type is checked before anything is allocated: a handshake reads only handshake-sized
  // frames, so a peer that has not proved the token cannot make this worker hold a data frame.
  if (header.type != expected && header.type != FrameType::kAbort) {
    throw common::IoError(fmt::format("{}: bad frame: expected {}, got {}", peer,
                                      frame_type_name(expected), frame_type_name(header.type)));
  }
  std::vector<unsigned char> payload(header.length);
  read_exact(fd, payload.data(), payload.size(), deadline, peer);
  if (header.type == FrameType::kAbort)
    throw common::IoError(std::string(payload.begin(), payload.end()));
  return payload;
}

void send_abort(int fd, const std::string& message) noexcept {
  try {
    std::string text = message.substr(0, kMaxAbortPayload);
    write_frame(fd, FrameType::kAbort, text.data(), text.size(), Deadline(0.1, "abort"), "abort");
  } catch (...) {
  }
}

}  // namespace dtrain::comm
