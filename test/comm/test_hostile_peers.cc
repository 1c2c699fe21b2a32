// What a hostile or careless peer can cost, with real sockets. A worker's ring port (127.0.0.1):
// a frame header of the wrong type is refused before its payload is allocated, and a crowd of
// idle connections that reconnect as fast as they are closed neither stops a 2-rank ring from
// forming nor floods the log. The launcher's control socket (UNIX): silent connections, overlong
// lines, unread replies and too many connections are closed, and running out of descriptors
// pauses accepting instead of spinning.
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "common/ports.h"
#include "launcher/control/control_server.h"
#include "test/support/temp_dir.h"
#include "worker/comm/frame.h"
#include "worker/comm/tcp/acceptor.h"
#include "worker/comm/tcp/tcp_ring_link.h"

using namespace dtrain::comm;

namespace {

// Non-blocking connection attempt to 127.0.0.1:port; -1 when the socket cannot be made.
int start_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Keeps `per_port` idle connections open to each port, opening a new one as soon as one is
// closed or refused (what a connection flood or a crowd of port scanners looks like).
class IdleCrowd {
 public:
  IdleCrowd(std::vector<int> ports, int per_port) : ports_(std::move(ports)) {
    for (int port : ports_) slots_.insert(slots_.end(), static_cast<size_t>(per_port), {port, -1});
    thread_ = std::thread([this] { run(); });
  }
  ~IdleCrowd() {
    stop_ = true;
    thread_.join();
    for (auto& [port, fd] : slots_)
      if (fd >= 0) ::close(fd);
  }
  int connections_made() const { return made_; }

 private:
  void run() {
    while (!stop_) {
      for (auto& [port, fd] : slots_) {
        if (fd >= 0) continue;
        fd = start_connect(port);
        if (fd >= 0) ++made_;
      }
      std::vector<pollfd> fds;
      for (auto& slot : slots_) fds.push_back({slot.second, POLLIN, 0});
      ::poll(fds.data(), fds.size(), 10);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;  // still open and silent
        ::close(slots_[i].second);
        slots_[i].second = -1;
      }
    }
  }

  std::vector<int> ports_;
  std::vector<std::pair<int, int>> slots_;  ///< (port, fd or -1)
  std::atomic<bool> stop_{false};
  std::atomic<int> made_{0};
  std::thread thread_;
};

// Everything logged while it lives, for counting lines.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() {
    spdlog::default_logger()->flush();
    return text_.str();
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream text_;
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

RingIdentity identity(int rank, const std::vector<int>& ports) {
  RingIdentity id;
  id.job = "hostile";
  id.rank = rank;
  id.size = static_cast<int>(ports.size());
  id.token = "0123abcd";
  for (size_t r = 0; r < ports.size(); ++r) {
    id.names.push_back("worker:" + std::to_string(r));
    id.addresses.push_back("127.0.0.1:" + std::to_string(ports[r]));
  }
  return id;
}

void send_header(int fd, FrameType type, uint32_t length) {
  unsigned char header[kFrameHeaderBytes];
  encode_header({type, length}, header);
  REQUIRE(::send(fd, header, sizeof header, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof header));
}

}  // namespace

TEST_CASE("a frame header of an unexpected type is refused before its payload is read") {
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0);
  // A 16 MiB data frame is within the data limit; during a handshake it must not be read at all
  // (nothing follows the header, so reading its payload would wait for the deadline instead).
  send_header(pair[1], FrameType::kData, kMaxDataPayload);
  CHECK_THROWS_WITH(read_frame(pair[0], FrameType::kHello, Deadline(3, "the handshake"), "peer"),
                    "peer: bad frame: expected hello, got data");
  ::close(pair[0]);
  ::close(pair[1]);
}

TEST_CASE("an unauthenticated data frame header is answered with a refusal at once") {
  std::vector<int> ports = dtrain::common::pick_free_ports(2);
  CommOptions options;
  options.handshake_seconds = 30;  // a refusal before this proves the payload was not awaited
  Acceptor acceptor(identity(0, ports), options);
  int fd = start_connect(ports[0]);
  REQUIRE(fd >= 0);
  pollfd writable{fd, POLLOUT, 0};
  REQUIRE(::poll(&writable, 1, 10000) == 1);
  send_header(fd, FrameType::kData, kMaxDataPayload);
  CHECK_THROWS_WITH(read_frame(fd, FrameType::kAccept, Deadline(20, "the refusal"), "acceptor"),
                    Catch::Contains("bad frame: expected hello, got data"));
  ::close(fd);
  CHECK(acceptor.refused() == 1);
}

TEST_CASE(
    "40 idle connections per port that reconnect at once neither stop the ring nor flood "
    "the log") {
  CapturedLog log;
  std::vector<int> ports = dtrain::common::pick_free_ports(2);
  IdleCrowd crowd(ports, 40);
  CommOptions options;
  options.rendezvous_seconds = 30;
  std::vector<int> sums(2, 0);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    // Rank 1 comes late, when the crowd has taken every slot that rank 0's port offers.
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ranks.emplace_back([&, r] {
      try {
        auto link = rendezvous(identity(r, ports), options);
        int mine = r + 1;
        link->send_recv(&mine, sizeof mine, &sums[static_cast<size_t>(r)], sizeof(int));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(sums == std::vector<int>{2, 1});  // each rank got its neighbour's value
  WARN("the crowd made " << crowd.connections_made() << " connections");
  CHECK(crowd.connections_made() >= 80);
  std::string text = log.text();
  INFO(text.substr(0, 4000));
  // At most 10 refusals per port are logged one by one per 10 s; the rest are counted.
  CHECK(count(text, "refused connection from") <= 40);
  CHECK(text.size() < 20000);
}

// ---- The launcher's control socket (launcher/control/control_server.h) ----

namespace {

// A ControlServer on its own io_context thread, answering every request with a ~1 KiB line.
struct ControlFixture {
  explicit ControlFixture(dtrain::launcher::ControlLimits limits) {
    server = std::make_unique<dtrain::launcher::ControlServer>(
        io, path, [](const dtrain::common::ControlMessage&) {},
        [](const std::string&) { return R"({"ok":true,"pad":")" + std::string(1000, 'x') + "\"}"; },
        limits);
  }
  ~ControlFixture() { stop(); }
  void run() {
    thread = std::thread([this] { io.run(); });
  }
  void stop() {
    work.reset();
    io.stop();
    if (thread.joinable()) thread.join();
  }
  // A blocking client whose reads give up after 20 s.
  int connect() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    timeval timeout{20, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    return fd;
  }

  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/control.sock";
  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work{
      io.get_executor()};
  std::unique_ptr<dtrain::launcher::ControlServer> server;
  std::thread thread;
};

// Reads until the server closes the connection: true then, false when 20 s pass first.
bool read_until_closed(int fd, size_t* bytes = nullptr) {
  char buffer[65536];
  size_t total = 0;
  while (true) {
    ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      total += static_cast<size_t>(n);
      continue;
    }
    if (bytes) *bytes = total;
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }
}

std::string request_line(int fd) {
  std::string request = "{\"request\": \"status\"}\n";
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  std::string line;
  char c;
  while (::recv(fd, &c, 1, 0) == 1 && c != '\n') line += c;
  return line;
}

}  // namespace

TEST_CASE("the control socket closes a connection that stays silent") {
  dtrain::launcher::ControlLimits limits;
  limits.idle_seconds = 0.3;
  ControlFixture f(limits);
  f.run();
  int fd = f.connect();
  CHECK(request_line(fd).rfind("{\"ok\":true", 0) == 0);  // activity keeps it open
  CHECK(read_until_closed(fd));                           // silence does not
  ::close(fd);
}

TEST_CASE("the control socket closes a connection whose line is over the length limit") {
  ControlFixture f(dtrain::launcher::ControlLimits{});
  f.run();
  int fd = f.connect();
  std::string line = std::string(10000, 'x') + "\n";  // within the old 64 KiB, over 8 KiB
  (void)!::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
  CHECK(read_until_closed(fd));
  ::close(fd);
}

TEST_CASE("the control socket drops a client that does not read its replies") {
  dtrain::launcher::ControlLimits limits;
  limits.max_queued_reply_bytes = 64 * 1024;
  ControlFixture f(limits);
  f.run();
  int fd = f.connect();
  std::string requests;
  for (int i = 0; i < 5000; ++i) requests += "{\"request\": \"status\"}\n";  // 5 MB of replies
  // Blocking send: it ends when the server has read it all, or with EPIPE once it hung up.
  (void)!::send(fd, requests.data(), requests.size(), MSG_NOSIGNAL);
  // Reads nothing until the server hangs up (a Unix socket reports that with replies unread):
  // reading at once, this client kept up with a slow server (TSan) that then never dropped it.
  pollfd hangup{fd, POLLRDHUP, 0};
  CHECK(::poll(&hangup, 1, 20000) == 1);
  size_t got = 0;
  CHECK(read_until_closed(fd, &got));
  CHECK(got < 5000 * 1000);
  ::close(fd);
}

TEST_CASE("when every control connection is taken, the one idle longest makes room") {
  dtrain::launcher::ControlLimits limits;
  limits.max_connections = 4;
  ControlFixture f(limits);
  f.run();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(f.connect());
    CHECK(request_line(idle.back()).rfind("{\"ok\":true", 0) == 0);  // accepted and served
  }
  int fresh = f.connect();
  CHECK(request_line(fresh).rfind("{\"ok\":true", 0) == 0);
  int closed = 0;
  for (int fd : idle) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1 && read_until_closed(fd)) ++closed;
    ::close(fd);
  }
  CHECK(closed == 5);  // connections 5 to 9 each pushed out the one idle longest
  ::close(fresh);
}

TEST_CASE("out of descriptors, the control socket pauses accepting instead of spinning") {
  dtrain::launcher::ControlLimits limits;
  limits.accept_pause_seconds = 0.2;
  ControlFixture f(limits);
  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(f.connect());  // queued, not yet accepted
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(clients.back() + 8);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> filler;  // takes every descriptor number left under the limit
  for (int fd; (fd = ::dup(0)) >= 0;) filler.push_back(fd);
  size_t handlers = f.io.run_for(std::chrono::seconds(1));
  for (int fd : filler) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK(handlers < 100);  // a few pauses; spinning on EMFILE runs thousands
  f.run();                // descriptors are back: the queued clients are served
  for (int fd : clients) {
    CHECK(request_line(fd).rfind("{\"ok\":true", 0) == 0);
    ::close(fd);
  }
}
