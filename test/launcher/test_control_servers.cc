// The launcher's local servers under hostile local clients (issue 25), in this process: a flood of
// metrics connections is bounded, a control-socket flood of junk is released at once and logs a
// bounded number of warnings, the fallback socket folder must be private, and clients refuse a
// socket served by another user. The control server's clock is the test's; the asserts are on
// order and counts, and waits have only guards against a hang. Not tested here: a whole launch
// (test_daemon does that).
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <sstream>
#include <thread>
#include <vector>

#include "common/control_protocol.h"
#include "common/errors.h"
#include "common/unique_fd.h"
#include "launcher/control/control_client.h"
#include "launcher/control/control_server.h"
#include "launcher/view/metrics_server.h"
#include "test/support/processes.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

// An io_context run by a thread of its own; ask() runs a function there and waits for its answer.
struct IoThread {
  IoThread() : guard(io.get_executor()), thread([this] { io.run(); }) {}
  ~IoThread() { stop(); }
  void stop() {
    if (!thread.joinable()) return;
    guard.reset();
    io.stop();
    thread.join();
  }
  template <typename F>
  auto ask(F f) {
    std::promise<decltype(f())> answer;
    boost::asio::post(io, [&] { answer.set_value(f()); });
    return answer.get_future().get();
  }
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard;
  std::thread thread;
};

// Every log line of the test goes to text (the default logger is put back at the end).
struct CapturedLog {
  CapturedLog() : previous(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>(
        "captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(text));
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous); }
  size_t lines_with(const std::string& what) {
    std::istringstream in(text.str());
    size_t n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
    return n;
  }
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> previous;
};

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

common::UniqueFd connect_unix(const std::string& path) {
  common::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

common::UniqueFd connect_tcp(int port) {
  common::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

// A listening socket on a free loopback port, made by listen_for_metrics; *port says which.
common::UniqueFd metrics_listener(int* port) {
  for (int tries = 0; tries < 50; ++tries) {
    int candidate = 20000 + static_cast<int>((::getpid() * 7 + tries * 131) % 30000);
    try {
      common::UniqueFd fd = launcher::listen_for_metrics(candidate);
      *port = candidate;
      return fd;
    } catch (const common::ConfigError&) {
    }
  }
  FAIL("no free loopback port");
  return {};
}

// A guard against a hang, not a time limit: far above the seconds anything here takes.
constexpr double kGuardSeconds = 60;

// Whether the server has closed its end of fd (an end of file or a reset is waiting).
bool closed_by_server(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte = 0;
  ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

std::string scrape(int port) {
  common::UniqueFd fd = connect_tcp(port);
  std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  REQUIRE(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  timeval limit{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd.get(), buffer, sizeof buffer, 0)) > 0;)
    response.append(buffer, static_cast<size_t>(n));
  return response;
}

}  // namespace

TEST_CASE(
    "a flood of metrics connections holds the bound, the oldest gives way, a scrape answers") {
  int port = 0;
  common::UniqueFd listener = metrics_listener(&port);
  IoThread loop;
  // Clients get an hour: within the test only the bound closes a connection.
  launcher::MetricsServer server(
      loop.io, std::move(listener), [] { return "dtrain_up 1\n"; }, 3600);
  size_t before = open_fds();

  constexpr size_t kFlood = 100;  // idle clients that never send a request
  constexpr size_t kGivenWay = kFlood - launcher::kMaxMetricsConnections;
  std::vector<common::UniqueFd> flood;
  for (size_t i = 0; i < kFlood; ++i) flood.push_back(connect_tcp(port));
  // Each client beyond the bound closes the oldest one open: the last one's closes client
  // kGivenWay - 1, and then every client has been accepted.
  REQUIRE(testing::wait_for([&] { return closed_by_server(flood[kGivenWay - 1].get()); },
                            kGuardSeconds));
  for (size_t i = 0; i < kFlood; ++i) {
    CAPTURE(i);
    CHECK(closed_by_server(flood[i].get()) == (i < kGivenWay));
  }
  CHECK(loop.ask([&] { return server.open_connections(); }) == launcher::kMaxMetricsConnections);
  CHECK(open_fds() - before - kFlood == launcher::kMaxMetricsConnections);

  std::string response = scrape(port);  // while the flood is held
  CHECK(response.rfind("HTTP/1.0 200 OK", 0) == 0);
  CHECK(response.find("dtrain_up 1") != std::string::npos);
  CHECK(testing::wait_for([&] { return closed_by_server(flood[kGivenWay].get()); },
                          kGuardSeconds));  // the scrape's connection took its place
  CHECK_FALSE(closed_by_server(flood[kGivenWay + 1].get()));
}

TEST_CASE("metrics clients that send nothing are closed by their time-out") {
  int port = 0;
  common::UniqueFd listener = metrics_listener(&port);
  IoThread loop;
  launcher::MetricsServer server(loop.io, std::move(listener), [] { return "dtrain_up 1\n"; });
  size_t before = open_fds();
  std::vector<common::UniqueFd> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connect_tcp(port));
  // Nothing but the time-out (kMetricsClientSeconds) closes them; the guard is far longer.
  CHECK(testing::wait_for(
      [&] {
        return std::all_of(idle.begin(), idle.end(),
                           [](const common::UniqueFd& fd) { return closed_by_server(fd.get()); });
      },
      kGuardSeconds));
  CHECK(loop.ask([&] { return server.open_connections(); }) == 0);
  CHECK(open_fds() - before - idle.size() == 0);
}

TEST_CASE("a control-socket flood of junk is released at once, with one warning a second") {
  testing::TempDir dir;
  CapturedLog log;
  IoThread loop;
  std::atomic<double> now{100};  // the server's clock, moved by the test alone
  std::string path = dir.path() + "/control.sock";
  launcher::ControlLimits limits;
  limits.idle_seconds = 3600;  // far beyond the guard: a connection is released by its close
  launcher::ControlServer server(
      loop.io, path, [](const common::ControlMessage&) {},
      [](const std::string&) { return std::string(R"({"ok":true})"); }, limits,
      [&] { return now.load(); });
  auto warnings_logged = [&] { return loop.ask([&] { return log.lines_with("control socket"); }); };
  auto held_back = [&] { return loop.ask([&] { return server.warnings_held_back(); }); };

  std::string junk;
  for (int i = 0; i < 50; ++i) junk += "junk line that is no JSON\n";
  auto flood = [&](size_t connections) {
    for (size_t i = 0; i < connections; ++i) {
      common::UniqueFd fd = connect_unix(path);
      (void)!::send(fd.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
    }  // each closed unread
    // Accepted in order: once a later client has its answer, every flood connection was taken.
    common::UniqueFd probe = connect_unix(path);
    std::string status = "{\"request\": \"status\"}\n";
    REQUIRE(::send(probe.get(), status.data(), status.size(), MSG_NOSIGNAL) > 0);
    timeval limit{static_cast<time_t>(kGuardSeconds), 0};
    ::setsockopt(probe.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    char byte = 0;
    REQUIRE(::recv(probe.get(), &byte, 1, 0) == 1);
  };
  auto released = [&] {
    return loop.ask([&] { return server.live_connections() + server.open_connections(); }) == 0;
  };

  flood(200);
  // Released when each client closed, not kept until the idle time-out.
  CHECK(testing::wait_for(released, kGuardSeconds));
  // The clock stood still: the first warning went to the log, every later one was held back.
  CHECK(warnings_logged() == 1);
  CHECK(log.lines_with("malformed") == 1);
  size_t before = held_back();
  CHECK(before > 0);

  now = now + 0.9;  // still within the second
  flood(1);
  CHECK(testing::wait_for(released, kGuardSeconds));
  CHECK(warnings_logged() == 1);
  CHECK(held_back() > before);

  now = now + 0.2;  // a second after the first: the next one is logged, with the count
  flood(1);
  CHECK(testing::wait_for(released, kGuardSeconds));
  CHECK(warnings_logged() == 2);
  CHECK(loop.ask([&] { return log.lines_with("held back since the last one"); }) == 1);
  loop.stop();
}

TEST_CASE("the control socket keeps at most max_connections open; the idlest gives way") {
  testing::TempDir dir;
  IoThread loop;
  std::string path = dir.path() + "/control.sock";
  launcher::ControlLimits limits;
  limits.max_connections = 8;
  limits.idle_seconds = 3600;    // far beyond the guard: only the bound closes a connection
  std::atomic<double> now{100};  // the server's clock, moved by the test alone
  std::atomic<size_t> messages{0};
  launcher::ControlServer server(
      loop.io, path, [&](const common::ControlMessage&) { ++messages; }, {}, limits,
      [&] { return now.load(); });
  std::string hello = common::format_control_message(common::heartbeat_message("worker:0", 0, 1));
  auto connect_and_greet = [&] {
    common::UniqueFd fd = connect_unix(path);
    REQUIRE(::send(fd.get(), hello.data(), hello.size(), MSG_NOSIGNAL) > 0);
    return fd;
  };

  SECTION("a flood: with every client as idle as the others, the oldest go first") {
    constexpr size_t kFlood = 40, kGivenWay = kFlood - 8;
    std::vector<common::UniqueFd> held;
    for (size_t i = 0; i < kFlood; ++i) held.push_back(connect_and_greet());
    REQUIRE(testing::wait_for([&] { return closed_by_server(held[kGivenWay - 1].get()); },
                              kGuardSeconds));
    CHECK(testing::wait_for(
        [&] { return loop.ask([&] { return server.live_connections(); }) == 8; }, kGuardSeconds));
    for (size_t i = 0; i < kFlood; ++i) {
      CAPTURE(i);
      CHECK(closed_by_server(held[i].get()) == (i < kGivenWay));
    }
    CHECK(loop.ask([&] { return server.open_connections(); }) == 8);
  }
  SECTION("a client that spoke since is kept; the one idle longest goes") {
    std::vector<common::UniqueFd> held;
    for (size_t i = 0; i < 8; ++i) held.push_back(connect_and_greet());
    REQUIRE(testing::wait_for([&] { return messages == 8; }, kGuardSeconds));
    now = now + 1;
    REQUIRE(::send(held[0].get(), hello.data(), hello.size(), MSG_NOSIGNAL) > 0);
    REQUIRE(testing::wait_for([&] { return messages == 9; }, kGuardSeconds));
    common::UniqueFd newcomer = connect_and_greet();
    REQUIRE(testing::wait_for([&] { return messages == 10; }, kGuardSeconds));
    CHECK_FALSE(closed_by_server(held[0].get()));  // the oldest, but it spoke at now + 1
    CHECK(closed_by_server(held[1].get()));        // idle since now
    for (size_t i = 2; i < 8; ++i) CHECK_FALSE(closed_by_server(held[i].get()));
    CHECK_FALSE(closed_by_server(newcomer.get()));
    CHECK(loop.ask([&] { return server.open_connections(); }) == 8);
  }
}

TEST_CASE("the fallback socket folder must be this user's and private") {
  testing::TempDir dir;
  std::string folder = dir.path() + "/dtrain-" + std::to_string(::geteuid());
  struct stat info {};

  SECTION("made with mode 0700 when missing, and accepted again") {
    launcher::make_private_dir(folder);
    REQUIRE(::stat(folder.c_str(), &info) == 0);
    CHECK((info.st_mode & 0777) == 0700);
    CHECK(info.st_uid == ::geteuid());
    CHECK_NOTHROW(launcher::make_private_dir(folder));
  }
  SECTION("refused when group or others may enter it") {
    REQUIRE(::mkdir(folder.c_str(), 0700) == 0);
    REQUIRE(::chmod(folder.c_str(), 0755) == 0);
    CHECK_THROWS_WITH(launcher::make_private_dir(folder), Catch::Contains("chmod 700"));
    REQUIRE(::chmod(folder.c_str(), 0777) == 0);
    CHECK_THROWS_AS(launcher::make_private_dir(folder), common::IoError);
  }
  SECTION("refused when it is a symlink") {
    std::string target = dir.path() + "/elsewhere";
    REQUIRE(::mkdir(target.c_str(), 0700) == 0);
    REQUIRE(::symlink(target.c_str(), folder.c_str()) == 0);
    CHECK_THROWS_AS(launcher::make_private_dir(folder), common::IoError);
  }
  SECTION("refused when another user owns it") {
    if (::geteuid() != 0) {
      WARN("not root: cannot make a folder of another user");
      return;
    }
    REQUIRE(::mkdir(folder.c_str(), 0700) == 0);
    REQUIRE(::chown(folder.c_str(), 65534, 65534) == 0);
    CHECK_THROWS_WITH(launcher::make_private_dir(folder), Catch::Contains("belongs to uid 65534"));
  }
}

TEST_CASE("a run directory too long for a socket path gets its socket in the private folder") {
  testing::TempDir dir;
  std::string run_dir = dir.path() + "/" + std::string(120, 'r');
  std::string path = launcher::control_socket_path(run_dir);
  CHECK(path.rfind(launcher::fallback_socket_dir() + "/", 0) == 0);
  CHECK(path.size() < sizeof(sockaddr_un{}.sun_path));
  CHECK(launcher::control_socket_path(dir.path()) == dir.path() + "/control.sock");

  boost::asio::io_context io;
  launcher::ControlServer server(io, path, [](const common::ControlMessage&) {});
  struct stat info {};
  REQUIRE(::stat(launcher::fallback_socket_dir().c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0700);
  CHECK(info.st_uid == ::geteuid());
  REQUIRE(::stat(path.c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
}

TEST_CASE("a control socket served by another user is trusted by no client") {
  CHECK(common::trusted_control_peer(1000, 1000));
  CHECK(common::trusted_control_peer(0, 1000));  // root may serve anyone
  CHECK_FALSE(common::trusted_control_peer(65534, 1000));
  CHECK_FALSE(common::trusted_control_peer(1000, 0));
  if (::geteuid() != 0) {
    WARN("not root: cannot run a server as another user");
    return;
  }

  testing::TempDir dir;  // the run directory, open to the other user as a planted one would be
  REQUIRE(::chmod(dir.path().c_str(), 0777) == 0);
  std::string path = dir.path() + "/control.sock";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t child = ::fork();
  if (child == 0) {  // nobody, answering every line with {"ok":true}
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener, 8) != 0)
      ::_exit(4);
    (void)!::write(ready[1], "x", 1);
    for (int served = 0; served < 8; ++served) {
      int fd = ::accept(listener, nullptr, nullptr);
      char buffer[256];
      if (fd >= 0 && ::read(fd, buffer, sizeof buffer) > 0)
        (void)!::write(fd, "{\"ok\":true}\n", 12);
      if (fd >= 0) ::close(fd);
    }
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);

  CHECK_THROWS_WITH(launcher::ask_launcher(dir.path(), R"({"request":"stop"})"),
                    Catch::Contains("served by uid 65534"));
  common::ControlClient worker(common::kControlScheme + path);
  CHECK_FALSE(worker.send(common::heartbeat_message("worker:0", 0, ::getpid())));

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST_CASE("a deferred request is answered later on its connection, or dropped with it") {
  testing::TempDir dir;
  IoThread loop;
  std::string path = dir.path() + "/control.sock";
  launcher::ControlServer server(loop.io, path, [](const common::ControlMessage&) {});
  std::vector<std::pair<std::string, launcher::ControlServer::Reply>> held;  // loop thread only
  loop.ask([&] {
    server.defer("reform", [&](const std::string& request, launcher::ControlServer::Reply reply) {
      held.emplace_back(request, std::move(reply));
    });
    return 0;
  });
  auto wait_held = [&](size_t n) {
    for (int i = 0; i < 300 && loop.ask([&] { return held.size(); }) < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(loop.ask([&] { return held.size(); }) == n);
  };
  common::ReformRequest request{"worker:0", 0,     0,
                                12,         false, "worker:1 (rank 1): connection closed"};

  // The worker's own client waits for the answer that comes after the request was taken.
  auto answer = std::async(std::launch::async, [&] {
    return common::ControlClient(server.address()).request_reform(request, 10);
  });
  wait_held(1);
  CHECK(loop.ask([&] { return held[0].first.find("\"whole_step\":12") != std::string::npos; }));
  CHECK(answer.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  loop.ask([&] {
    held[0].second(common::format_reform_reply({true, 3, ""}));
    held[0].second(common::format_reform_reply({true, 4, ""}));  // only the first is sent
    return 0;
  });
  std::optional<common::ReformReply> reply = answer.get();
  REQUIRE(reply);
  CHECK(reply->ok);
  CHECK(reply->generation == 3);

  // A second request before the first one's answer is refused at once.
  std::string line = common::format_reform_request(request);
  common::UniqueFd fd = connect_unix(path);
  std::string two = line + line;
  REQUIRE(::send(fd.get(), two.data(), two.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(two.size()));
  char buffer[512] = {};
  ssize_t n = ::recv(fd.get(), buffer, sizeof buffer - 1, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buffer, n).find("still pending") != std::string::npos);
  wait_held(2);

  // A closed connection is released at once although its reply is still held; the reply then
  // does nothing.
  fd.reset();
  for (int i = 0; i < 300 && loop.ask([&] { return server.live_connections(); }) > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(loop.ask([&] { return server.live_connections(); }) == 0);
  loop.ask([&] {
    held[1].second(common::format_reform_reply({true, 1, ""}));
    held.clear();
    return 0;
  });
  CHECK(loop.ask([&] { return server.live_connections(); }) == 0);
}
