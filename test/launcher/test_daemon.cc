// The launcher as a daemon, with real dtrain-workers: --detach, status while running, a graceful
// stop that leaves a checkpoint and exit 143, launching again resumes, status after the daemon
// was SIGKILLed says so and no worker survives, and the control socket is for this user only and
// survives garbage. --metrics-port is range-checked, a busy port fails the launch even detached,
// and workers do not inherit the metrics socket.
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

const char* kJob = R"({"job": "daemon", "workers": 2,
 "restart": {"max_restarts": 2, "backoff_seconds": 0.1, "grace_seconds": 10},
 "train": {"model": {"input_shape": [12, 12, 1], "layers": [
   {"type": "conv2d", "filters": 8, "kernel_size": 3, "activation": "relu"}, {"type": "flatten"},
   {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "data": {"source": "synthetic", "examples": 512, "classes": 4},
  "per_worker_batch_size": 16, "epochs": EPOCHS, "steps_per_epoch": 50, "seed": 3,
  "backup": {"save_freq": 20, "keep": 2}}})";

struct Daemon {
  explicit Daemon(int epochs) {
    std::string text = kJob;
    text.replace(text.find("EPOCHS"), 6, std::to_string(epochs));
    std::ofstream(job()) << text;
  }
  std::string job() const { return dir.path() + "/job.json"; }
  std::string run() const { return dir.path() + "/run"; }
  testing::ProcessResult dtrain(std::vector<std::string> args, double timeout = 120) const {
    args.insert(args.begin(), testing::binary("dtrain"));
    return testing::run_process(args, {{}, "", timeout, dir.path()});
  }
  common::JsonDocument status_json() const {
    auto r = dtrain({"status", run(), "--json"});
    REQUIRE(r.exit_code == 0);
    return common::JsonDocument::parse(r.out, "status");
  }
  void wait_for(const std::string& path) const {
    for (int i = 0; i < 3000 && !fs::exists(path); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(fs::exists(path));
  }
  testing::TempDir dir;
};

}  // namespace

TEST_CASE("detach, status, graceful stop, and launching again resumes the run") {
  Daemon d(400);
  auto started = d.dtrain({"launch", d.job(), "--run-dir", d.run(), "--detach"});
  REQUIRE(started.exit_code == 0);
  CHECK(started.out == d.run() + "\n");
  d.wait_for(d.run() + "/backup/ckpt-0000000020.safetensors");

  auto status = d.status_json();
  auto s = status.root();
  CHECK(s.at("daemon").as_string() == "running");
  CHECK(s.at("status").as_string() == "running");
  CHECK(s.at("job").as_string() == "daemon");
  CHECK(s.at("attempt").as_int(0, 9) == 0);
  CHECK(s.at("uptime_seconds").as_number(0, 1e6) > 0);
  auto workers = s.at("workers").as_array();
  REQUIRE(workers.size() == 2);
  for (const auto& w : workers) {
    CHECK(w.at("state").as_string() == "running");
    CHECK(w.at("pid").as_int(1, 1 << 30) > 0);
    CHECK(w.at("last_progress").at("step").as_int(1, 1 << 30) >= 1);
    CHECK(w.at("last_progress").at("loss").as_number(0, 1e9) >= 0);
    CHECK(w.at("progress_age_seconds").as_number(0, 1e6) < 60);
  }
  auto human = d.dtrain({"status", d.run()});
  CHECK(human.out.find("job \"daemon\": running") != std::string::npos);
  CHECK(human.out.find("preemptions 0, steps redone 0") != std::string::npos);
  CHECK(human.out.find("worker:1") != std::string::npos);

  auto stopped = d.dtrain({"stop", d.run()});
  CHECK(stopped.exit_code == 0);
  CHECK(stopped.out.find(": stopped") != std::string::npos);
  // It says what the stop left: the step of the checkpoint the chief saved (issue 46).
  CHECK(stopped.out.find("the chief saved a checkpoint at global step ") != std::string::npos);
  std::string events = common::read_file(d.run() + "/events.jsonl");
  CHECK(events.find("\"task\":\"worker:0\"") != std::string::npos);
  CHECK(events.find("\"outcome\":\"preempted\",\"status\":\"exit code 143") != std::string::npos);
  std::string log = common::read_file(d.run() + "/logs/worker-0.log");
  CHECK(log.find("preempted: stopped at epoch") != std::string::npos);
  auto after = d.status_json();
  CHECK(after.root().at("daemon").as_string() == "gone");
  CHECK(after.root().at("status").as_string() == "stopped");

  // Launching again resumes where the stop left off; make the job short enough to finish.
  std::string text = common::read_file(d.job());
  text.replace(text.find("\"epochs\": 400"), 13, "\"epochs\": 3");
  std::ofstream(d.job(), std::ios::trunc) << text;
  auto resumed = d.dtrain({"launch", d.job(), "--run-dir", d.run()});
  INFO(resumed.err);
  CHECK(resumed.exit_code == 0);
  CHECK(common::read_file(d.run() + "/logs/worker-0.log").find(": resuming at epoch") !=
        std::string::npos);
}

TEST_CASE("status after the daemon was SIGKILLed says it is gone, and no worker survives") {
  Daemon d(400);
  REQUIRE(d.dtrain({"launch", d.job(), "--run-dir", d.run(), "--detach"}).exit_code == 0);
  d.wait_for(d.run() + "/backup/ckpt-0000000020.safetensors");
  std::vector<int> pids;
  common::JsonDocument status_doc = d.status_json();  // the nodes below point into it
  for (const auto& w : status_doc.root().at("workers").as_array())
    pids.push_back(static_cast<int>(w.at("pid").as_int(1, 1 << 30)));
  int daemon_pid = std::stoi(common::read_file(d.run() + "/launcher.pid"));
  ::kill(daemon_pid, SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  auto status = d.dtrain({"status", d.run()});
  CHECK(status.exit_code == 0);
  CHECK(status.out.find("launcher pid " + std::to_string(daemon_pid) + ": gone") !=
        std::string::npos);
  CHECK(status.out.find("the launcher is gone without finishing the run") != std::string::npos);
  for (int pid : pids) CHECK_FALSE(testing::process_alive(pid));
  CHECK_FALSE(testing::process_alive(daemon_pid));
}

TEST_CASE("the control socket is for this user only and survives garbage") {
  Daemon d(400);
  REQUIRE(d.dtrain({"launch", d.job(), "--run-dir", d.run(), "--detach"}).exit_code == 0);
  d.wait_for(d.run() + "/control.sock");
  struct stat info {};
  REQUIRE(::stat(d.run().c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0700);
  REQUIRE(::stat((d.run() + "/control.sock").c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);

  auto connect_as = [&](uid_t uid) {  // in a child, so this process keeps its own uid
    pid_t child = ::fork();
    if (child == 0) {
      if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(3);
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", (d.run() + "/control.sock").c_str());
      ::_exit(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    return WEXITSTATUS(status);
  };
  if (::geteuid() == 0) {
    CHECK(connect_as(65534) == 1);  // another user cannot even reach the socket
  } else {
    WARN("not root: cannot test another user's connection");
  }

  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", (d.run() + "/control.sock").c_str());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  std::string garbage = "garbage\n{\"request\": 5}\n{\"request\": \"explode\"}\n\x01\x02\xff\n" +
                        std::string(100000, 'x') + "\n";
  (void)!::write(fd, garbage.data(), garbage.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd);
  auto status = d.status_json();
  CHECK(status.root().at("daemon").as_string() == "running");
  CHECK(d.dtrain({"stop", d.run(), "--now"}).exit_code == 0);
}

namespace {

// A socket bound to a free loopback port, listening when asked; *port says which.
int bound_socket(int* port, bool listening) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  if (listening) REQUIRE(::listen(fd, 1) == 0);
  socklen_t length = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
  *port = ntohs(a.sin_port);
  return fd;
}

// The inode of the socket listening on 127.0.0.1:port, from /proc/net/tcp ("" if none).
std::string listener_inode(int port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::string local = fmt::format("0100007F:{:04X}", port);
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, address, remote, state, queues, timer, retransmits, uid, timeout, inode;
    fields >> slot >> address >> remote >> state >> queues >> timer >> retransmits >> uid >>
        timeout >> inode;
    if (address == local && state == "0A") return inode;
  }
  return "";
}

// What the descriptors of process pid point at ("socket:[123]", paths, ...).
std::vector<std::string> open_files(int pid) {
  std::vector<std::string> targets;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec))
    targets.push_back(fs::read_symlink(entry.path(), ec).string());
  return targets;
}

}  // namespace

TEST_CASE("--metrics-port must be a TCP port, and a busy one fails the launch, detached or not") {
  Daemon d(400);
  for (std::string bad : {"70000", "-1", "0"}) {
    auto r = d.dtrain({"launch", d.job(), "--run-dir", d.run(), "--detach", "--metrics-port", bad});
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--metrics-port " + bad + ": not a TCP port (1-65535)") != std::string::npos);
    if (r.exit_code == 0) d.dtrain({"stop", d.run(), "--now"});
  }
  int port = 0;
  int busy = bound_socket(&port, true);
  for (bool detach : {true, false}) {
    std::vector<std::string> args = {"launch", d.job(),          "--run-dir",
                                     d.run(),  "--metrics-port", std::to_string(port)};
    if (detach) args.push_back("--detach");
    auto r = d.dtrain(args);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(fmt::format("cannot listen on 127.0.0.1:{}: Address already in use", port)) !=
          std::string::npos);
    if (r.exit_code == 0) d.dtrain({"stop", d.run(), "--now"});
  }
  ::close(busy);
}

TEST_CASE(
    "--metrics-port serves restarts, preemptions and per-worker progress in Prometheus format") {
  Daemon d(400);
  int port = 0;
  ::close(bound_socket(&port, false));
  REQUIRE(d.dtrain({"launch", d.job(), "--run-dir", d.run(), "--detach", "--metrics-port",
                    std::to_string(port)})
              .exit_code == 0);
  d.wait_for(d.run() + "/backup/ckpt-0000000020.safetensors");
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;)
    response.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  CHECK(response.rfind("HTTP/1.0 200 OK", 0) == 0);
  CHECK(response.find("dtrain_restarts_total{job=\"daemon\"} 0") != std::string::npos);
  CHECK(response.find("dtrain_preemptions_total{job=\"daemon\"} 0") != std::string::npos);
  CHECK(response.find("dtrain_worker_up{job=\"daemon\",task=\"worker:1\"} 1") != std::string::npos);
  CHECK(response.find("dtrain_worker_samples_per_second{job=\"daemon\",task=\"worker:0\"}") !=
        std::string::npos);
  CHECK(response.find("dtrain_worker_loss{job=\"daemon\",task=\"worker:0\"}") != std::string::npos);

  // The listening socket is the launcher's alone: no worker inherited it.
  std::string inode = listener_inode(port);
  REQUIRE_FALSE(inode.empty());
  int daemon_pid = std::stoi(common::read_file(d.run() + "/launcher.pid"));
  auto holds_listener = [&](int pid) {
    auto files = open_files(pid);
    return std::find(files.begin(), files.end(), "socket:[" + inode + "]") != files.end();
  };
  CHECK(holds_listener(daemon_pid));
  common::JsonDocument status_doc = d.status_json();  // the nodes below point into it
  for (const auto& w : status_doc.root().at("workers").as_array())
    CHECK_FALSE(holds_listener(static_cast<int>(w.at("pid").as_int(1, 1 << 30))));
  CHECK(d.dtrain({"stop", d.run(), "--now"}).exit_code == 0);
}
