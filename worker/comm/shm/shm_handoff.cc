// See shm_handoff.h. A peer's hello is 8 bytes (magic, rank); rank 0 answers with one byte that
// carries the descriptor. Every wait is a poll with the remaining time of one overall deadline.
#include "worker/comm/shm/shm_handoff.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/errors.h"

namespace dtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kHelloMagic = 0x73686d31;  // "shm1"

[[noreturn]] void throw_errno(const std::string& what) {
  throw common::IoError(fmt::format("shared memory: {}: {}", what, std::strerror(errno)));
}

socklen_t abstract_address(const std::string& name, sockaddr_un& address) {
  DT_ENFORCE(name.size() + 1 < sizeof address.sun_path, "socket name {} too long", name);
  address = {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// True when fd became readable before the deadline.
bool wait_readable(int fd, Clock::time_point deadline) {
  pollfd entry{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&entry, 1, remaining_ms(deadline));
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

bool peer_is(int connection, pid_t pid) {
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) return false;
  return cred.pid == pid && cred.uid == ::getuid();
}

// The rank a freshly accepted peer says it is, when it is that rank's process; -1 otherwise.
int verified_rank(int connection, const std::vector<pid_t>& pids, Clock::time_point deadline) {
  uint32_t hello[2] = {};
  // A stranger that says nothing may hold the hand-off up for one second, not the whole set-up.
  if (!wait_readable(connection, std::min(deadline, Clock::now() + std::chrono::seconds(1))))
    return -1;
  if (::recv(connection, hello, sizeof hello, MSG_WAITALL) != sizeof hello) return -1;
  const int rank = static_cast<int>(hello[1]);
  if (hello[0] != kHelloMagic || rank < 1 || rank >= static_cast<int>(pids.size())) return -1;
  return peer_is(connection, pids[static_cast<size_t>(rank)]) ? rank : -1;
}

void send_fd(int connection, int fd) {
  char byte = 'F';
  iovec data{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  if (::sendmsg(connection, &message, MSG_NOSIGNAL) != 1) throw_errno("sending the segment");
}

}  // namespace

std::string shm_socket_name(const RingIdentity& id, pid_t rank0_pid) {
  const std::string key =
      fmt::format("{}\n{}\n{}\n{}\n{}", id.token, id.job, id.attempt, id.generation, rank0_pid);
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a, 64 bits
  for (unsigned char c : key) hash = (hash ^ c) * 0x100000001b3ull;
  return fmt::format("dtrain-shm-{:016x}", hash);
}

FdServer::FdServer(const std::string& name, int peers) : name_(name) {
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_.valid()) throw_errno("socket");
  sockaddr_un address;
  const socklen_t length = abstract_address(name, address);
  if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), length) != 0)
    throw_errno(fmt::format("bind to abstract socket @{}", name));
  if (::listen(listener_.get(), peers + 8) != 0) throw_errno("listen");
}

void FdServer::hand_out(int fd, const std::vector<pid_t>& pids, const RingIdentity& id,
                        double timeout_seconds) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_seconds));
  std::vector<bool> served(pids.size(), false);
  size_t left = pids.size() - 1;
  while (left > 0) {
    if (!wait_readable(listener_.get(), deadline)) {
      std::string missing;
      for (size_t r = 1; r < pids.size(); ++r)
        if (!served[r]) missing += (missing.empty() ? "" : ", ") + id.describe(int(r));
      throw common::IoError(
          fmt::format("shared memory: timed out after {} s waiting for {} to connect to @{}",
                      timeout_seconds, missing, name_));
    }
    common::UniqueFd connection(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    const int rank = verified_rank(connection.get(), pids, deadline);
    if (rank < 0 || served[size_t(rank)]) continue;  // a stranger: dropped
    send_fd(connection.get(), fd);
    served[size_t(rank)] = true;
    --left;
  }
}

common::UniqueFd connect_to_fd_server(const std::string& name, int rank) {
  common::UniqueFd connection(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!connection.valid()) throw_errno("socket");
  sockaddr_un address;
  const socklen_t length = abstract_address(name, address);
  if (::connect(connection.get(), reinterpret_cast<sockaddr*>(&address), length) != 0)
    throw_errno(fmt::format("connect to abstract socket @{}", name));
  const uint32_t hello[2] = {kHelloMagic, static_cast<uint32_t>(rank)};
  if (::send(connection.get(), hello, sizeof hello, MSG_NOSIGNAL) != sizeof hello)
    throw_errno("sending the hello");
  return connection;
}

common::UniqueFd receive_segment_fd(int connection, pid_t rank0_pid, double timeout_seconds) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_seconds));
  if (!wait_readable(connection, deadline)) {
    throw common::IoError(
        fmt::format("shared memory: timed out after {} s waiting for rank 0 to send the segment",
                    timeout_seconds));
  }
  if (!peer_is(connection, rank0_pid))
    throw common::IoError("shared memory: the segment's sender is not rank 0's process");
  char byte = 0;
  iovec data{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  if (::recvmsg(connection, &message, MSG_CMSG_CLOEXEC) != 1) throw_errno("receiving the segment");
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  if (header == nullptr || header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS)
    throw common::IoError("shared memory: rank 0's message carried no descriptor");
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(header), sizeof(int));
  return common::UniqueFd(fd);
}

}  // namespace dtrain::comm
