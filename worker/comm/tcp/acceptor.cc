// See acceptor.h.
#include "worker/comm/tcp/acceptor.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/cluster_spec.h"
#include "common/errors.h"
#include "common/thread_name.h"
#include "worker/comm/handshake.h"

namespace dtrain::comm {
namespace {
// Slots for handshakes in progress. When all are taken, the oldest connection that has had
// kEvictableAfterSeconds to finish (a real worker needs milliseconds) is closed to make room;
// while none has, new connections wait in the kernel's queue, which serves them in order, so
// idle sockets cannot starve the ring's own connection however fast they reconnect.
constexpr size_t kMaxPendingHandshakes = 16;
constexpr double kEvictableAfterSeconds = 0.5;
// accept() out of descriptors or memory: pause instead of spinning on a listener that stays
// readable.
constexpr double kAcceptPauseSeconds = 0.1;
constexpr int kRefusalsLoggedPerInterval = 10;
constexpr double kRefusalLogIntervalSeconds = 10;

int ms_until(double when, double now) {
  return std::clamp(static_cast<int>((when - now) * 1000) + 1, 1, 100);
}
}  // namespace

RefusalLog::RefusalLog(int budget, double interval_seconds)
    : budget_(budget), interval_(interval_seconds) {}

void RefusalLog::refused(const std::string& peer, const std::string& reason, double now) {
  flush(now);
  if (started_ < 0) started_ = now;
  // Each kind of refusal is logged the first time in an interval even past the budget, so a
  // flood of one kind cannot hide another; the kinds themselves are capped too.
  std::string kind = reason.rfind(peer + ": ", 0) == 0 ? reason.substr(peer.size() + 2) : reason;
  bool new_kind = kinds_.size() < static_cast<size_t>(2 * budget_) && kinds_.insert(kind).second;
  if (logged_ < budget_ || new_kind) {
    ++logged_;
    spdlog::warn("refused connection from {}: {}", peer, reason);
  } else {
    ++unlogged_;
  }
}

void RefusalLog::flush(double now) {
  if (started_ < 0 || now - started_ < interval_) return;
  if (unlogged_ > 0) {
    spdlog::warn(
        "refused {} more connection(s) in the last {:.0f} s (repeats are not logged one by one)",
        unlogged_, now - started_);
  }
  started_ = -1;
  logged_ = unlogged_ = 0;
  kinds_.clear();
}

namespace {
constexpr double kBusyPortSeconds = 5;
}  // namespace

Acceptor::Acceptor(const RingIdentity& id, const CommOptions& options)
    : id_(id),
      options_(options),
      refusals_(kRefusalsLoggedPerInterval, kRefusalLogIntervalSeconds) {
  const std::string& address = id_.addresses[static_cast<size_t>(id_.rank)];
  common::HostPort hp = common::parse_host_port(address, id_.names[static_cast<size_t>(id_.rank)]);
  // A later generation's member may start while the one it replaces still goes away (a remote
  // worker's end is reported before its host has freed the port): its port is tried again.
  listener_ = listen_on(hp.host, hp.port, id_.generation > 0 ? kBusyPortSeconds : 0);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw common::IoError("acceptor: pipe failed");
  wake_read_.reset(fds[0]);
  wake_write_.reset(fds[1]);
  thread_ = std::thread([this] {
    common::name_this_thread("dt-accept");
    accept_loop();
  });
}

Acceptor::~Acceptor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (const Pending& p : pending_) ::shutdown(p.fd, SHUT_RDWR);
  }
  (void)!::write(wake_write_.get(), "x", 1);
  thread_.join();
  for (auto& t : handshakes_) t.join();
  refusals_.flush(common::monotonic_seconds() + kRefusalLogIntervalSeconds);
}

int Acceptor::refused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refused_;
}

void Acceptor::accept_loop() {
  while (true) {
    int wait_ms = 100;
    bool ready = ready_to_accept(wait_ms);
    pollfd fds[2] = {{listener_.get(), static_cast<short>(ready ? POLLIN : 0), 0},
                     {wake_read_.get(), POLLIN, 0}};
    ::poll(fds, 2, wait_ms);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    join_finished_handshakes();
    refusals_.flush(common::monotonic_seconds());
    if (ready && (fds[0].revents & POLLIN)) accept_one();
  }
}

// False while accepting is paused or every slot holds a connection too young to close; wait_ms
// then says when to look again.
bool Acceptor::ready_to_accept(int& wait_ms) const {
  std::lock_guard<std::mutex> lock(mutex_);
  double now = common::monotonic_seconds();
  if (now < paused_until_) {
    wait_ms = ms_until(paused_until_, now);
    return false;
  }
  size_t active = 0;
  const Pending* oldest = nullptr;
  for (const Pending& p : pending_) {
    if (p.evicted) continue;
    ++active;
    if (!oldest) oldest = &p;
  }
  if (active < kMaxPendingHandshakes) return true;
  double evictable_at = oldest->accepted_at + kEvictableAfterSeconds;
  if (now >= evictable_at) return true;
  wait_ms = ms_until(evictable_at, now);
  return false;
}

// Called with the lock held.
void Acceptor::accept_one() {
  int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  double now = common::monotonic_seconds();
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      paused_until_ = now + kAcceptPauseSeconds;
      refusals_.refused("a new peer", fmt::format("accept failed: {}", std::strerror(errno)), now);
    }
    return;
  }
  size_t active = static_cast<size_t>(
      std::count_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.evicted; }));
  if (active >= kMaxPendingHandshakes) evict_oldest();
  pending_.push_back({fd, now});
  handshakes_.emplace_back([this, fd] { handshake(fd); });
}

// Called with the lock held. Its handshake thread sees the end of stream and reports it.
void Acceptor::evict_oldest() {
  for (Pending& p : pending_) {
    if (p.evicted) continue;
    p.evicted = true;
    ::shutdown(p.fd, SHUT_RDWR);
    return;
  }
}

// Called with the lock held.
void Acceptor::join_finished_handshakes() {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    auto done = std::find(finished_.begin(), finished_.end(), it->get_id());
    if (done == finished_.end()) {
      ++it;
      continue;
    }
    finished_.erase(done);
    it->join();
    it = handshakes_.erase(it);
  }
}

// Server half of the handshake (client half: connector.cc) up to the proof. Throws IoError.
void Acceptor::authenticate(int fd, const std::string& peer, const Deadline& deadline) {
  std::vector<unsigned char> hello_bytes = read_frame(fd, FrameType::kHello, deadline, peer);
  Hello hello = decode_hello(hello_bytes);
  std::string problem =
      check_hello(hello, id_.job, id_.attempt, id_.generation, static_cast<uint32_t>(id_.size),
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
}

// Called with the lock held: the first authenticated connection becomes previous_. Returns ""
// when owned was handed over, else why not.
std::string Acceptor::hand_over(common::UniqueFd& owned, const std::string& peer,
                                const Deadline& deadline) {
  if (previous_.valid() || previous_taken_) return "rank already connected";
  try {
    write_frame(owned.get(), FrameType::kAccept, nullptr, 0, deadline, peer);
  } catch (const std::exception& e) {
    return e.what();
  }
  previous_ = std::move(owned);
  arrived_.notify_all();
  return "";
}

// Called with the lock held. Returns whether the connection had been evicted.
bool Acceptor::forget_pending(int fd) {
  auto it =
      std::find_if(pending_.begin(), pending_.end(), [fd](const Pending& p) { return p.fd == fd; });
  bool evicted = it != pending_.end() && it->evicted;
  if (it != pending_.end()) pending_.erase(it);
  return evicted;
}

// One incoming connection, on its own thread. Owns fd until it is handed over.
void Acceptor::handshake(int fd) {
  common::UniqueFd owned(fd);
  std::string peer = peer_name(fd);
  Deadline deadline(options_.handshake_seconds, "the handshake");
  std::string problem;
  try {
    authenticate(fd, peer, deadline);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.push_back(std::this_thread::get_id());
  if (forget_pending(fd)) {
    problem =
        fmt::format("closed after {:.1f} s without a handshake: all {} handshake slots were taken",
                    kEvictableAfterSeconds, kMaxPendingHandshakes);
  }
  if (problem.empty()) problem = hand_over(owned, peer, deadline);
  if (problem.empty()) return;
  ++refused_;
  refusals_.refused(peer, problem, common::monotonic_seconds());
  lock.unlock();
  send_abort(fd, "refused by " + id_.describe(id_.rank) + ": " + problem);
}

common::UniqueFd Acceptor::wait_for_previous(const Deadline& deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!previous_.valid()) {
    if (options_.superseded && options_.superseded()) throw common::IoError(kSuperseded);
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
