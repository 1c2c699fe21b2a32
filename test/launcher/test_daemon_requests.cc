// Requests to a running launcher's control socket (issue 25): an unknown request is answered
// with JSON (ok=false), and a run directory too long for a socket path still gets a working
// control socket, in this user's private fallback folder, and a reform request is taken only from
// the task's own process (issue 43). Not tested here: the request kinds themselves (test_daemon
// does status and stop).
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

const char* kLongJob = R"({"job": "requests", "workers": 1,
 "restart": {"max_restarts": 0, "grace_seconds": 10},
 "train": {"model": {"input_shape": [12, 12, 1], "layers": [
   {"type": "conv2d", "filters": 8, "kernel_size": 3, "activation": "relu"}, {"type": "flatten"},
   {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "data": {"source": "synthetic", "examples": 512, "classes": 4},
  "per_worker_batch_size": 16, "epochs": 400, "steps_per_epoch": 50, "seed": 3}})";

// A command job whose two workers each send their own reform request on DTRAIN_CONTROL, print
// the launcher's reply and wait.
const char* kAskingJob = R"({"job": "asking", "workers": 2,
 "command": ["python3", "-c", "import json, os, socket, sys, time\nt = json.loads(os.environ['TF_CONFIG'])['task']\ns = socket.socket(socket.AF_UNIX)\ns.connect(os.environ['DTRAIN_CONTROL'][5:])\ns.sendall((json.dumps({'request': 'reform', 'task': 'worker:%d' % t['index'], 'attempt': 0, 'generation': 0, 'whole_step': -1, 'in_flight': False, 'what': 'test'}) + '\\n').encode())\nprint('reply: ' + s.makefile().readline().strip(), flush=True)\ntime.sleep(120)\n"],
 "restart": {"max_restarts": 0, "grace_seconds": 1}})";

struct Launched {
  explicit Launched(std::string run_dir, const char* job = kLongJob) : run(std::move(run_dir)) {
    std::ofstream(dir.path() + "/job.json") << job;
  }
  testing::ProcessResult dtrain(std::vector<std::string> args) const {
    args.insert(args.begin(), testing::binary("dtrain"));
    return testing::run_process(args, {{}, "", 120, dir.path()});
  }
  void launch() const {
    auto r = dtrain({"launch", dir.path() + "/job.json", "--run-dir", run, "--detach"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  void stop() const { dtrain({"stop", run, "--now"}); }
  testing::TempDir dir;
  std::string run;
};

// Sends one line to the socket at path and returns the reply line (waits up to 10 s for both).
std::string ask(const std::string& path, const std::string& line) {
  int fd = -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  for (int i = 0; i < 1000; ++i) {  // the daemon binds its socket shortly after detaching
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    ::close(fd);
    fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(fd >= 0);
  timeval limit{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string out = line + "\n";
  REQUIRE(::send(fd, out.data(), out.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(out.size()));
  std::string reply;
  char buffer[4096];
  while (reply.find('\n') == std::string::npos) {
    ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return reply.substr(0, reply.find('\n'));
}

std::string read_log(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("an unknown control request is answered with JSON saying ok=false") {
  testing::TempDir base;
  Launched job(base.path() + "/run");
  job.launch();
  std::string reply = ask(job.run + "/control.sock", R"({"request":"bogus"})");
  job.stop();
  INFO(reply);
  common::JsonDocument doc = common::JsonDocument::parse(reply, "reply");
  CHECK_FALSE(doc.root().at("ok").as_bool());
  CHECK(doc.root().at("error").as_string().find("bogus") != std::string::npos);
}

TEST_CASE("a run directory too long for a socket path is controlled through the private folder") {
  testing::TempDir base;
  Launched job(base.path() + "/" + std::string(110, 'r'));
  job.launch();
  std::string daemon;  // no answer, then "gone", until the daemon listens
  for (int i = 0; i < 200 && daemon != "running"; ++i) {
    auto status = job.dtrain({"status", job.run, "--json"});
    if (status.exit_code == 0)
      daemon = common::JsonDocument::parse(status.out, "status").root().at("daemon").as_string();
    if (daemon != "running") std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO(read_log(job.run + "/launcher.log"));
  CHECK(daemon == "running");
  std::string folder = "/tmp/dtrain-" + std::to_string(::geteuid());
  struct stat info {};
  REQUIRE(::stat(folder.c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0700);
  CHECK(info.st_uid == ::geteuid());
  CHECK(job.dtrain({"stop", job.run, "--now"}).exit_code == 0);
}

// Issue 43: any process of this user could send a reform request naming a healthy worker, which
// the launcher then blamed. Now a request is taken only from the task's own process (or its
// process group): a forged one is refused, naming who sent it, and logged; the workers' own pass
// (and are answered as usual: a command job does not recover in place).
TEST_CASE("a reform request from a process other than the task's is refused and logged") {
  testing::TempDir base;
  Launched job(base.path() + "/run", kAskingJob);
  job.launch();
  const std::string forged =
      R"({"request":"reform","task":"worker:1","attempt":0,"generation":0,"whole_step":5,)"
      R"("in_flight":false,"what":"forged"})";
  std::string reply = ask(job.run + "/control.sock", forged);
  std::string worker_log;  // the worker's own request, answered past the check
  for (int i = 0; i < 400 && worker_log.find("reply: ") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    worker_log = read_log(job.run + "/logs/worker-1.log");
  }
  std::string launcher_log = read_log(job.run + "/launcher.log");
  job.stop();
  INFO(reply);
  common::JsonDocument doc = common::JsonDocument::parse(reply, "reply");
  CHECK_FALSE(doc.root().at("ok").as_bool());
  std::string error = doc.root().at("error").as_string();
  CHECK(error.find("pid " + std::to_string(::getpid()) + " is neither worker:1's process") !=
        std::string::npos);
  INFO(launcher_log);
  CHECK(launcher_log.find("refused a reform request for worker:1 from pid " +
                          std::to_string(::getpid())) != std::string::npos);
  INFO(worker_log);
  CHECK(worker_log.find("recovery in place is off for this launch") != std::string::npos);
}
