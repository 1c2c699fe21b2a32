// Sockets for ports.h: bind to port 0 and read back what the OS chose.
#include "common/ports.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/unique_fd.h"

namespace dtrain::common {

std::vector<int> pick_free_ports(int count) {
  std::vector<UniqueFd> held;
  std::vector<int> ports;
  for (int i = 0; i < count; ++i) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) throw IoError(fmt::format("socket(): {}", std::strerror(errno)));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      throw IoError(fmt::format("bind 127.0.0.1:0: {}", std::strerror(errno)));
    }
    socklen_t length = sizeof addr;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      throw IoError(fmt::format("getsockname: {}", std::strerror(errno)));
    }
    ports.push_back(ntohs(addr.sin_port));
    held.push_back(std::move(fd));
  }
  return ports;
}

bool is_port_free(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) throw IoError(fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc)));
  bool free = true;
  for (addrinfo* a = found; a != nullptr && free; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE) free = false;
  }
  ::freeaddrinfo(found);
  return free;
}

std::vector<std::string> listen_addresses(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) throw IoError(fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc)));
  std::vector<std::string> numeric;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) ==
            0 &&
        std::find(numeric.begin(), numeric.end(), text) == numeric.end())
      numeric.emplace_back(text);
  }
  ::freeaddrinfo(found);
  return numeric;
}

}  // namespace dtrain::common
