// The TCP ring with real processes on 127.0.0.1 (test/helpers/comm_worker.cc): 2 and 4 workers
// agree bit for bit; bad connections are refused while a real job keeps running; a killed
// worker or an abort makes every other worker fail fast with that worker's name.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "common/cluster_spec.h"
#include "common/ports.h"
#include "common/tf_config.h"
#include "test/support/subprocess.h"
#include "worker/comm/frame.h"

using dtrain::testing::BackgroundProcess;
using dtrain::testing::ProcessOptions;
using dtrain::testing::ProcessResult;
using Clock = std::chrono::steady_clock;

namespace {

struct Ring {
  explicit Ring(int n) {
    for (int port : dtrain::common::pick_free_ports(n))
      addresses.push_back("localhost:" + std::to_string(port));
    cluster = dtrain::common::ClusterSpec({{"worker", addresses}});
  }
  ProcessOptions env(int rank, const std::string& token = "0123abcd", int attempt = 0) const {
    ProcessOptions o;
    o.env["TF_CONFIG"] = dtrain::common::format_tf_config(cluster, {"worker", rank});
    o.env["DTRAIN_TOKEN"] = token;
    o.env["DTRAIN_JOB"] = "ringtest";
    o.env["DTRAIN_ATTEMPT"] = std::to_string(attempt);
    o.env["DTRAIN_LOG_LEVEL"] = "info";
    return o;
  }
  void start(const std::vector<std::string>& flags) {
    for (size_t r = 0; r < addresses.size(); ++r) {
      std::vector<std::string> argv = {dtrain::testing::binary("comm_worker")};
      argv.insert(argv.end(), flags.begin(), flags.end());
      workers.push_back(std::make_unique<BackgroundProcess>(argv, env(static_cast<int>(r))));
    }
  }
  std::vector<ProcessResult> wait_all(double timeout = 120) {
    std::vector<ProcessResult> results;
    for (auto& w : workers) results.push_back(w->wait(timeout));
    return results;
  }
  int port(int rank) const {
    return dtrain::common::parse_host_port(addresses[static_cast<size_t>(rank)], "test").port;
  }
  std::vector<std::string> addresses;
  dtrain::common::ClusterSpec cluster;
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
};

std::vector<std::string> checksums(const std::string& out) {
  std::vector<std::string> lines;
  std::regex line("iteration \\d+ checksum=[0-9a-f]+");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    lines.push_back(it->str());
  }
  return lines;
}

// A raw TCP client for the misbehaving connections.
int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TEST_CASE("2 and 4 workers all-reduce, broadcast, gather and barrier over TCP, bit-identically") {
  for (int n : {2, 4}) {
    INFO(n << " workers");
    Ring ring(n);
    ring.start({"--iterations", "3", "--count", "100003"});
    auto results = ring.wait_all();
    for (auto& r : results) {
      INFO(r.err);
      CHECK(r.exit_code == 0);
    }
    std::vector<std::string> first = checksums(results[0].out);
    CHECK(first.size() == 3);
    for (auto& r : results) CHECK(checksums(r.out) == first);
  }
}

TEST_CASE("bad connections are refused and logged while a real job keeps running correctly") {
  Ring ring(2);
  ring.start(
      {"--iterations", "40", "--count", "4099", "--pause-ms", "100", "--handshake-seconds", "1"});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the ring is up and working
  int target = ring.port(0);
  // A port scanner; garbage bytes; an oversized frame; half a frame that stalls.
  if (int fd = raw_connect(target); fd >= 0) ::close(fd);
  if (int fd = raw_connect(target); fd >= 0) {
    (void)!::write(fd, "GET / HTTP/1.0\r\n\r\n", 18);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::close(fd);
  }
  if (int fd = raw_connect(target); fd >= 0) {
    unsigned char header[dtrain::comm::kFrameHeaderBytes];
    dtrain::comm::encode_header({dtrain::comm::FrameType::kHello, 1u << 30}, header);
    (void)!::write(fd, header, sizeof header);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::close(fd);
  }
  int staller = raw_connect(target);
  (void)!::write(staller, "\x01\x00\x00", 3);
  // A worker with the wrong token, and a stray worker of an earlier attempt (right token).
  std::string intruder = dtrain::testing::binary("comm_worker");
  auto wrong_token = dtrain::testing::run_process(
      {intruder, "--intruder", "1", "--rendezvous-seconds", "1.5"}, ring.env(1, "ffff0000"));
  auto stale = dtrain::testing::run_process(
      {intruder, "--intruder", "1", "--rendezvous-seconds", "1.5"}, ring.env(1, "0123abcd", 7));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the staller's handshake time-out
  ::close(staller);
  CHECK(wrong_token.exit_code != 0);
  CHECK(wrong_token.err.find("does not know this job's token") != std::string::npos);
  CHECK(stale.exit_code != 0);
  CHECK(stale.err.find("attempt 7 (this group is attempt 0)") != std::string::npos);

  auto results = ring.wait_all();
  for (auto& r : results) CHECK(r.exit_code == 0);
  CHECK(checksums(results[0].out).size() == 40);
  CHECK(checksums(results[0].out) == checksums(results[1].out));
  const std::string& log = results[0].err;
  INFO(log);
  CHECK(log.find("refused connection from 127.0.0.1") != std::string::npos);
  CHECK(log.find("bad frame: hello frame of 1073741824 bytes exceeds the limit") !=
        std::string::npos);
  CHECK(log.find("bad frame: unknown frame type") != std::string::npos);  // the HTTP request
  CHECK(log.find("wrong token") != std::string::npos);
  CHECK(log.find("attempt 7 (this group is attempt 0)") != std::string::npos);
  CHECK(log.find("timed out after 1 s waiting for the handshake") != std::string::npos);
  CHECK(log.find("connection closed") != std::string::npos);  // the scanner
}

TEST_CASE("killing one worker makes the others fail fast, naming it") {
  Ring ring(4);
  ring.start({"--iterations", "100000", "--count", "1000", "--pause-ms", "2"});
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  ring.workers[2]->signal(SIGKILL);
  auto killed_at = Clock::now();
  for (int r : {0, 1, 3}) {
    auto result = ring.workers[static_cast<size_t>(r)]->wait(60);
    double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
    INFO("rank " << r << " stderr: " << result.err);
    CHECK(result.exit_code == 1);
    CHECK(result.err.find("worker:2 (rank 2)") != std::string::npos);
    // Not a speed test: far below the 600 s collective time-out, so nobody waited for it.
    CHECK(seconds < 30);
    WARN("rank " << r << " failed " << seconds * 1000 << " ms after the kill");
  }
}

TEST_CASE("an abort message reaches every worker") {
  Ring ring(4);
  ring.start({"--iterations", "100000", "--count", "1000", "--abort", "1:5"});
  auto results = ring.wait_all(60);
  for (size_t r = 0; r < results.size(); ++r) {
    INFO("rank " << r << " stderr: " << results[r].err);
    CHECK(results[r].exit_code == 1);
    if (r != 1)
      CHECK(results[r].err.find("worker:1 (rank 1) failed: injected failure") != std::string::npos);
  }
}
