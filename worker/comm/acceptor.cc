// See acceptor.h.
#include "worker/comm/acceptor.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/cluster_spec.h"
#include "common/errors.h"
#include "worker/comm/handshake.h"

namespace dtrain::comm {
namespace {
constexpr size_t kMaxPendingHandshakes = 16;
}

Acceptor::Acceptor(const RingIdentity& id, const CommOptions& options)
    : id_(id), options_(options) {
  const std::string& address = id_.addresses[static_cast<size_t>(id_.rank)];
  common::HostPort hp = common::parse_host_port(address, id_.names[static_cast<size_t>(id_.rank)]);
  listener_ = listen_on(hp.host, hp.port);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw common::IoError("acceptor: pipe failed");
  wake_read_.reset(fds[0]);
  wake_write_.reset(fds[1]);
  thread_ = std::thread([this] { accept_loop(); });
}

Acceptor::~Acceptor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (int fd : pending_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  (void)!::write(wake_write_.get(), "x", 1);
  thread_.join();
  for (auto& t : handshakes_) t.join();
}

int Acceptor::refused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refused_;
}

void Acceptor::accept_loop() {
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    ::poll(fds, 2, 100);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    for (auto it = handshakes_.begin(); it != handshakes_.end();) {  // join finished ones
      auto done = std::find(finished_.begin(), finished_.end(), it->get_id());
      if (done == finished_.end()) {
        ++it;
        continue;
      }
      finished_.erase(done);
      it->join();
      it = handshakes_.erase(it);
    }
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    if (pending_fds_.size() >= kMaxPendingHandshakes) {
      ++refused_;
      spdlog::warn("refused connection from {}: too many handshakes in progress", peer_name(fd));
      ::close(fd);
      continue;
    }
    pending_fds_.push_back(fd);
    handshakes_.emplace_back([this, fd] { handshake(fd); });
  }
}

void Acceptor::refuse(int fd, const std::string& peer, const std::string& reason) {
  spdlog::warn("refused connection from {}: {}", peer, reason);
  send_abort(fd, "refused by " + id_.describe(id_.rank) + ": " + reason);
  std::lock_guard<std::mutex> lock(mutex_);
  ++refused_;
}

// Server half of the handshake (client half: connector.cc). Owns fd until it is handed over.
void Acceptor::handshake(int fd) {
  common::UniqueFd owned(fd);
  std::string peer = peer_name(fd);
  Deadline deadline(options_.handshake_seconds, "the handshake");
  try {
    std::vector<unsigned char> hello_bytes = read_frame(fd, FrameType::kHello, deadline, peer);
    Hello hello = decode_hello(hello_bytes);
    std::string problem = check_hello(hello, id_.job, id_.attempt, static_cast<uint32_t>(id_.size),
                                      static_cast<uint32_t>(id_.previous()));
    if (!problem.empty()) throw common::IoError(problem);
    Nonce server_nonce = random_nonce();
    Mac server_mac = handshake_mac(id_.token, "server", hello.nonce, server_nonce, hello_bytes);
    std::vector<unsigned char> challenge(server_nonce.begin(), server_nonce.end());
    challenge.insert(challenge.end(), server_mac.begin(), server_mac.end());
    write_frame(fd, FrameType::kChallenge, challenge.data(), challenge.size(), deadline, peer);
    std::vector<unsigned char> proof = read_frame(fd, FrameType::kProof, deadline, peer);
    Mac expected = handshake_mac(id_.token, "client", server_nonce, hello.nonce, hello_bytes);
    Mac got{};
    if (proof.size() != got.size()) throw common::IoError("malformed proof");
    std::copy(proof.begin(), proof.end(), got.begin());
    if (!macs_equal(got, expected))
      throw common::IoError("wrong token (HMAC of the nonce does not match)");
    std::lock_guard<std::mutex> lock(mutex_);
    if (previous_.valid() || previous_taken_) throw common::IoError("rank already connected");
    write_frame(fd, FrameType::kAccept, nullptr, 0, deadline, peer);
    previous_ = std::move(owned);
    arrived_.notify_all();
  } catch (const std::exception& e) {
    refuse(fd, peer, e.what());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pending_fds_.remove(fd);
  finished_.push_back(std::this_thread::get_id());
}

common::UniqueFd Acceptor::wait_for_previous(const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!previous_.valid()) {
    if (deadline.expired()) {
      throw common::IoError(fmt::format(
          "rendezvous: {} did not connect to {} within {:.0f} s", id_.describe(id_.previous()),
          id_.addresses[static_cast<size_t>(id_.rank)], deadline.seconds()));
    }
    arrived_.wait_for(lock, std::chrono::milliseconds(deadline.poll_ms(100) + 1));
  }
  previous_taken_ = true;
  return std::move(previous_);
}

}  // namespace dtrain::comm
