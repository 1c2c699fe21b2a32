// The multi-host test bed itself (test/support/netns_hosts.h): ssh between namespaces lands on the
// other host, the hosts reach each other over TCP, a cut link drops packets until restored, and a
// destroyed fixture leaves no namespace, sshd, process or key behind. Skips, with a WARN naming
// the reason, where the machine refuses (not root, no network namespaces, no sshd).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "test/support/netns_hosts.h"

using dtrain::testing::BackgroundProcess;
using dtrain::testing::NetnsHosts;
using dtrain::testing::process_alive;
using dtrain::testing::run_process;

namespace {

/// What one TCP connect from the calling thread came to within timeout_ms.
enum class Connect { kConnected, kRefused, kTimedOut, kOtherError };

Connect tcp_connect(const std::string& address, int port, int timeout_ms) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Connect::kOtherError;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &sa.sin_addr);
  int error = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 ? 0 : errno;
  if (error == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    socklen_t size = sizeof error;
    if (::poll(&p, 1, timeout_ms) != 1) {
      error = ETIMEDOUT;
    } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) {
      error = errno;
    }
  }
  ::close(fd);
  if (error == 0) return Connect::kConnected;
  if (error == ECONNREFUSED) return Connect::kRefused;
  return error == ETIMEDOUT || error == EHOSTUNREACH ? Connect::kTimedOut : Connect::kOtherError;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

ino_t namespace_inode(const std::string& name) {
  struct stat st {};
  return ::stat(("/run/netns/" + name).c_str(), &st) == 0 ? st.st_ino : 0;
}

/// Pids of live processes whose network namespace has one of these inodes.
std::vector<int> processes_in(const std::set<ino_t>& inodes) {
  std::vector<int> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    struct stat st {};
    if (::stat((entry.path() / "ns" / "net").c_str(), &st) == 0 && inodes.count(st.st_ino)) {
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

}  // namespace

TEST_CASE("ssh from host 0 runs a command on host 1, by key, as root") {
  NetnsHosts hosts;
  SKIP_UNLESS_AVAILABLE(hosts);
  REQUIRE(hosts.size() == 2);
  auto r = run_process(hosts.ssh_argv(0, 1, "hostname -I; ip -o -4 addr show dev eth0; id -u"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find(hosts.host(1)) != std::string::npos);
  CHECK(r.out.find(hosts.host(0)) == std::string::npos);
  CHECK(r.out.find("\n0\n") != std::string::npos);

  // The same ssh_command reaches host 0 from host 0 (a launcher's own host by address).
  auto self = run_process(hosts.ssh_argv(0, 0, "hostname -I"));
  INFO(self.err);
  CHECK(self.exit_code == 0);
  CHECK(self.out.find(hosts.host(0)) != std::string::npos);
  // And nothing else gets in: no key, no login (BatchMode rules out a password prompt).
  std::vector<std::string> no_key = hosts.exec_prefix(0);
  for (const char* a :
       {"ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
        "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "IdentityFile=/dev/null"})
    no_key.push_back(a);
  no_key.push_back("root@" + hosts.host(1));
  no_key.push_back("true");
  CHECK(run_process(no_key).exit_code == 255);
}

TEST_CASE("the hosts reach each other; a cut link drops packets until it is restored") {
  NetnsHosts hosts;
  SKIP_UNLESS_AVAILABLE(hosts);
  // Only from inside: the root namespace may have a default route (and, in some sandboxes, a
  // transparent proxy that accepts any outbound connect), so it proves nothing either way.
  Connect before;
  hosts.in_namespace(0, [&] { before = tcp_connect(hosts.host(1), 22, 2000); });
  CHECK(before == Connect::kConnected);

  hosts.cut_link(1);
  Connect cut_0_to_1, cut_1_to_0;
  auto start = std::chrono::steady_clock::now();
  hosts.in_namespace(0, [&] { cut_0_to_1 = tcp_connect(hosts.host(1), 22, 1000); });
  hosts.in_namespace(1, [&] { cut_1_to_0 = tcp_connect(hosts.host(0), 22, 1000); });
  double cut_seconds = seconds_since(start);
  CHECK(cut_0_to_1 == Connect::kTimedOut);  // silence, not a refusal: a pulled cable
  CHECK(cut_1_to_0 == Connect::kTimedOut);
  CHECK(cut_seconds < 3);

  hosts.restore_link(1);
  Connect after = Connect::kTimedOut;
  start = std::chrono::steady_clock::now();
  while (after != Connect::kConnected && seconds_since(start) < 3) {
    hosts.in_namespace(0, [&] { after = tcp_connect(hosts.host(1), 22, 500); });
  }
  CHECK(after == Connect::kConnected);
  CHECK(seconds_since(start) < 3);
}

TEST_CASE("a destroyed fixture leaves no namespace, sshd, process or key behind") {
  std::vector<std::string> names;
  std::set<ino_t> inodes;
  std::vector<int> sshd;
  std::string dir;
  std::unique_ptr<BackgroundProcess> session;  // outlives the fixture: the fixture must end it
  {
    NetnsHosts hosts(3);
    SKIP_UNLESS_AVAILABLE(hosts);
    for (int i = 0; i < hosts.size(); ++i) {
      names.push_back(hosts.namespace_name(i));
      inodes.insert(namespace_inode(hosts.namespace_name(i)));
      sshd.push_back(hosts.sshd_pid(i));
    }
    dir = hosts.dir();
    CHECK(inodes.size() == 3);
    CHECK(run_process(hosts.ssh_argv(2, 1, "true")).exit_code == 0);  // three hosts, one bridge
    struct stat st {};
    REQUIRE(::stat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
    session = std::make_unique<BackgroundProcess>(hosts.ssh_argv(0, 1, "sleep 300"));
    auto start = std::chrono::steady_clock::now();
    while (processes_in({namespace_inode(hosts.namespace_name(1))}).size() < 3 &&
           seconds_since(start) < 5) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // sshd, the session's sshd processes and sleep are in host 1.
    REQUIRE(processes_in({namespace_inode(hosts.namespace_name(1))}).size() >= 3);
  }
  auto listed = run_process({"ip", "netns", "list"});
  REQUIRE(listed.exit_code == 0);
  for (const auto& name : names) CHECK(listed.out.find(name) == std::string::npos);
  for (int pid : sshd) CHECK_FALSE(process_alive(pid));
  CHECK(processes_in(inodes).empty());
  CHECK_FALSE(std::filesystem::exists(dir));
  CHECK(session->wait(5).exit_code != 0);  // its ssh client, in host 0, was killed too
}
