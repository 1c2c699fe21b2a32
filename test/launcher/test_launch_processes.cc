// `dtrain launch` with real processes (test/helpers/test_worker.cc as the worker): each exit
// classification leads to its documented action, a killed worker restarts the group, a killed
// launcher leaves no process behind, logs keep every line, a stopped run resumes, a failed
// worker is replaced in place while its peers' reform requests are answered, and a stop with a
// worker that cannot be killed (a frozen cgroup) is bounded.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "test/support/test_beds.h"

using dtrain::testing::BackgroundProcess;
using dtrain::testing::binary;
using dtrain::testing::process_alive;
using dtrain::testing::run_process;
namespace fs = std::filesystem;

namespace {

struct Job {
  dtrain::testing::TempDir dir;
  std::string name = "t";
  std::string run_dir() const { return dir.path() + "/runs/" + name; }
  std::string path() const { return dir.path() + "/job.json"; }

  /// Writes a job whose workers run test_worker with flags; extra adds top-level keys.
  void write(int workers, const std::string& flags, const std::string& extra = "",
             const std::string& restart =
                 R"("max_restarts": 2, "backoff_seconds": 0.05, "grace_seconds": 1)") {
    std::string args = "\"" + binary("dtrain-test-worker") + "\"";
    std::istringstream words(flags);
    for (std::string w; words >> w;) args += ", \"" + w + "\"";
    std::ofstream(path()) << "{\"job\": \"" << name << "\", \"workers\": " << workers
                          << ", \"command\": [" << args << "], \"restart\": {" << restart << "}"
                          << extra << "}";
  }
  dtrain::testing::ProcessResult launch(double timeout = 60) const {
    dtrain::testing::ProcessOptions options;
    options.cwd = dir.path();
    options.timeout_seconds = timeout;
    return run_process({binary("dtrain"), "launch", path()}, options);
  }
  std::unique_ptr<BackgroundProcess> launch_in_background() const {
    dtrain::testing::ProcessOptions options;
    options.cwd = dir.path();
    return std::make_unique<BackgroundProcess>(
        std::vector<std::string>{binary("dtrain"), "launch", path()}, options);
  }
  std::string events() const { return dtrain::common::read_file(run_dir() + "/events.jsonl"); }
  std::string log(int worker) const {
    return dtrain::common::read_file(run_dir() + "/logs/worker-" + std::to_string(worker) + ".log");
  }
  int64_t state_int(const char* key) const {
    auto doc = dtrain::common::JsonDocument::parse(
        dtrain::common::read_file(run_dir() + "/state.json"), "state");
    return doc.root().at(key).as_int(-1, 1 << 30);
  }
  std::string state_string(const char* key) const {
    auto doc = dtrain::common::JsonDocument::parse(
        dtrain::common::read_file(run_dir() + "/state.json"), "state");
    return doc.root().at(key).as_string();
  }
  /// Waits (up to 20 s) for pids/<name>.pid, written by a test_worker, and returns the pid.
  int wait_pid(const std::string& file) const {
    std::string path = run_dir() + "/pids/" + file + ".pid";
    for (int i = 0; i < 2000; ++i) {
      int pid = 0;
      if (std::ifstream(path) >> pid && pid > 0) return pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL("no pid file " << path);
    return -1;
  }
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("exit 2 is a configuration error: no restart, exit 2, summary names the worker") {
  Job job;
  job.write(2, "--exit 2 --only worker:1");
  auto r = job.launch();
  CHECK(r.exit_code == 2);
  CHECK(count(job.events(), "\"event\":\"spawn\"") == 2);
  CHECK(r.err.find("first failure: worker:1 configuration error (exit code 2) on attempt 0") !=
        std::string::npos);
}

TEST_CASE(
    "a failing worker is restarted until the budget is used, then the summary shows its log") {
  Job job;
  job.write(2, "--exit 3 --only worker:0 --heartbeat --sleep 0.3", "",
            R"("max_restarts": 1, "backoff_seconds": 0.05)");
  auto r = job.launch();
  CHECK(r.exit_code == 3);
  CHECK(count(job.events(), "\"event\":\"spawn\"") == 4);
  CHECK(r.err.find("restart budget used up (max_restarts 1)") != std::string::npos);
  CHECK(r.err.find("first failure: worker:0 failed (exit code 3) on attempt 1") !=
        std::string::npos);
  CHECK(r.err.find("test_worker task=worker:0 attempt=1") != std::string::npos);
  CHECK(job.state_string("status") == "failed");
}

TEST_CASE("a crash is named by its signal and restarted; attempts are numbered") {
  Job job;
  job.write(2, "--signal 11 --only worker:1 --until-attempt 1 --heartbeat --sleep 0.2");
  auto r = job.launch();
  CHECK(r.exit_code == 0);
  CHECK(job.events().find("\"outcome\":\"crashed\",\"status\":\"killed by SIGSEGV\"") !=
        std::string::npos);
  CHECK(job.log(1).find("attempt=0") != std::string::npos);
  CHECK(job.log(1).find("attempt=1") != std::string::npos);
  CHECK(job.state_int("restarts") == 1);
}

TEST_CASE("a preempted worker (exit 143) restarts the group on the preemption budget") {
  Job job;
  job.write(2, "--exit 143 --only worker:0 --until-attempt 2 --sleep 0.1");
  auto r = job.launch();
  CHECK(r.exit_code == 0);
  CHECK(job.state_int("preemptions") == 2);
  CHECK(job.state_int("restarts") == 0);
  CHECK(job.state_int("attempt") == 2);
}

TEST_CASE("a hung worker is failed after hang_timeout_seconds and the group restarts") {
  Job job;
  job.write(2, "--hang --only worker:1 --until-attempt 1 --heartbeat --sleep 0.5",
            R"(, "hang_timeout_seconds": 1)");
  auto r = job.launch();
  CHECK(r.exit_code == 0);
  CHECK(job.events().find("\"event\":\"hang\",\"task\":\"worker:1\"") != std::string::npos);
}

TEST_CASE(
    "a worker that ignores SIGTERM is SIGKILLed after the grace period; its grandchild dies too") {
  Job job;
  job.write(2,
            "--ignore-sigterm --grandchild --exit 5 --only worker:1 --until-attempt 1 --sleep 0.5",
            "", R"("max_restarts": 2, "backoff_seconds": 0.05, "grace_seconds": 0.5)");
  auto r = job.launch();
  CHECK(r.exit_code == 0);
  CHECK(job.events().find("\"signal\":\"SIGKILL\"") != std::string::npos);
  int grandchild = job.wait_pid("grandchild-worker-0-0");
  CHECK_FALSE(process_alive(grandchild));
}

TEST_CASE("SIGKILL of one worker mid-run: the group restarts and succeeds on attempt 1") {
  Job job;
  job.write(3, "--sleep 2 --heartbeat --until-attempt 1 --exit 0");
  auto launcher = job.launch_in_background();
  int victim = job.wait_pid("worker-1-0");
  ::kill(victim, SIGKILL);
  auto r = launcher->wait(60);
  CHECK(r.exit_code == 0);
  CHECK(job.state_int("attempt") == 1);
  CHECK(job.events().find(
            "\"task\":\"worker:1\",\"pid\":" + std::to_string(victim) +
            ",\"attempt\":0,\"outcome\":\"preempted\",\"status\":\"killed by SIGKILL\"") !=
        std::string::npos);
}

TEST_CASE("SIGKILL of the launcher: no process of the run remains 2 s later") {
  Job job;
  job.write(3, "--grandchild --sleep 100");
  auto launcher = job.launch_in_background();
  std::vector<int> pids;
  for (int i = 0; i < 3; ++i) {
    pids.push_back(job.wait_pid("worker-" + std::to_string(i) + "-0"));
    pids.push_back(job.wait_pid("grandchild-worker-" + std::to_string(i) + "-0"));
  }
  for (int pid : pids) REQUIRE(process_alive(pid));
  launcher->signal(SIGKILL);
  launcher->wait(10);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  for (int pid : pids) {
    INFO("pid " << pid);
    CHECK_FALSE(process_alive(pid));
  }
}

TEST_CASE("4 workers x 500,000 lines: every line reaches its log whole and in order") {
  constexpr long kLines = 500000;
  Job job;
  job.write(4, "--lines " + std::to_string(kLines));
  auto r = job.launch(300);
  REQUIRE(r.exit_code == 0);
  for (int w = 0; w < 4; ++w) {
    std::ifstream log(job.run_dir() + "/logs/worker-" + std::to_string(w) + ".log");
    std::string line;
    long expected = 0;
    bool in_order = true;
    std::string prefix = "worker:" + std::to_string(w) + " line ";
    while (std::getline(log, line)) {
      if (line.rfind(prefix, 0) != 0) continue;
      in_order = in_order && line == prefix + std::to_string(expected) + " of " +
                                         std::to_string(kLines) +
                                         " ........................................";
      ++expected;
    }
    INFO("worker " << w);
    CHECK(expected == kLines);
    CHECK(in_order);
  }
  CHECK(count(r.out, " line ") == 4 * kLines);
}

TEST_CASE("partial last lines and \\r progress lines are kept") {
  Job job;
  job.write(1, "--partial --progress-bar");
  auto r = job.launch();
  CHECK(r.exit_code == 0);
  std::string log = job.log(0);
  CHECK(log.find("\r1/3 [=]\r2/3 [==]\r3/3 [===]\n") != std::string::npos);
  CHECK(log.size() >= 22);
  CHECK(log.substr(log.size() - 22) == "no newline at the end\n");
  CHECK(r.out.find("[worker 0] no newline at the end\n") != std::string::npos);
}

TEST_CASE("SIGTERM to the launcher stops the workers (exit 143); launching again resumes the run") {
  Job job;
  job.write(2, "--sleep 100");
  auto launcher = job.launch_in_background();
  int w0 = job.wait_pid("worker-0-0");
  job.wait_pid("worker-1-0");
  launcher->signal(SIGTERM);
  auto r = launcher->wait(30);
  CHECK(r.exit_code == 143);
  CHECK_FALSE(process_alive(w0));
  CHECK(job.state_string("status") == "stopped");
  CHECK(job.events().find("\"outcome\":\"preempted\",\"status\":\"killed by SIGTERM\"") !=
        std::string::npos);

  job.write(2, "--sleep 0.1");
  auto again = job.launch();
  CHECK(again.exit_code == 0);
  CHECK(job.log(0).find("attempt=1") != std::string::npos);
  CHECK(count(job.log(0), "==== dtrain: attempt ") == 2);
}

TEST_CASE("a second SIGINT to the launcher kills workers that ignore SIGTERM at once") {
  Job job;
  job.write(2, "--ignore-sigterm --sleep 100", "", R"("grace_seconds": 60)");
  auto launcher = job.launch_in_background();
  int w0 = job.wait_pid("worker-0-0");
  job.wait_pid("worker-1-0");
  launcher->signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(process_alive(w0));  // ignored SIGTERM; the grace period is long
  launcher->signal(SIGINT);
  auto r = launcher->wait(20);  // far less than the 60 s grace
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code == 143);
  CHECK_FALSE(process_alive(w0));
  CHECK(job.events().find("\"signal\":\"SIGKILL\"") != std::string::npos);
}

TEST_CASE("a second launcher on a running run directory refuses with exit 2") {
  Job job;
  job.write(1, "--sleep 100");
  auto first = job.launch_in_background();
  job.wait_pid("worker-0-0");
  auto second = job.launch();
  CHECK(second.exit_code == 2);
  CHECK(second.err.find("is in use by a running launcher (launcher pid " +
                        std::to_string(first->pid()) + ")") != std::string::npos);
  first->signal(SIGTERM);
  CHECK(first->wait(30).exit_code == 143);
}

TEST_CASE("a new launcher ends stale workers of its run, and only those") {
  Job job;
  fs::create_directories(job.run_dir());
  std::string run_dir = fs::canonical(job.run_dir()).string();
  dtrain::testing::ProcessOptions ours;
  ours.env["DTRAIN_RUN_DIR"] = run_dir;
  BackgroundProcess stale({"setsid", "sleep", "100"}, ours);
  BackgroundProcess stranger({"setsid", "sleep", "100"});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  dtrain::common::write_file_atomically(
      job.run_dir() + "/state.json",
      R"({"attempt": 0, "status": "running", "launcher_pid": 1, "workers": [{"pid": )" +
          std::to_string(stale.pid()) + R"(}, {"pid": )" + std::to_string(stranger.pid()) + "}]}");
  job.write(1, "--sleep 0.1");
  auto r = job.launch();
  CHECK(r.exit_code == 0);
  CHECK_FALSE(process_alive(stale.pid()));
  CHECK(process_alive(stranger.pid()));
  CHECK(job.log(0).find("attempt=1") != std::string::npos);
}

TEST_CASE("a busy worker port is named and exits 2; a missing program exits 2") {
  Job job;
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  socklen_t length = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  std::string port = std::to_string(ntohs(addr.sin_port));
  std::ofstream(job.path()) << R"({"job": "t", "cluster": {"worker": ["localhost:)" << port
                            << R"("]}, "command": ["true"]})";
  auto busy = job.launch();
  ::close(listener);
  CHECK(busy.exit_code == 2);
  CHECK(busy.err.find("port localhost:" + port + " of worker:0 is in use") != std::string::npos);

  std::ofstream(job.path())
      << R"({"job": "t", "workers": 1, "command": ["no-such-program-dtrain"]})";
  auto missing = job.launch();
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("\"no-such-program-dtrain\" not found on PATH") != std::string::npos);
}

TEST_CASE("a launch on a run that succeeded changes nothing; --fresh trains it again") {
  Job job;
  job.write(2, "--sleep 0.1");
  REQUIRE(job.launch().exit_code == 0);
  fs::create_directories(job.run_dir() + "/model");
  std::ofstream(job.run_dir() + "/model/model.json") << "{}";
  std::ofstream(job.run_dir() + "/metrics.jsonl") << "{\"epoch\": 1}\n";
  std::string events = job.events();

  auto again = job.launch();
  CHECK(again.exit_code == 0);
  CHECK(again.err.find("already succeeded") != std::string::npos);
  CHECK(again.err.find("--fresh") != std::string::npos);
  CHECK(job.events() == events);  // nothing started, nothing recorded
  CHECK(fs::exists(job.run_dir() + "/model/model.json"));
  CHECK(count(job.log(0), "==== dtrain: attempt ") == 1);

  dtrain::testing::ProcessOptions options;
  options.cwd = job.dir.path();
  auto dry = run_process({binary("dtrain"), "launch", job.path(), "--dry-run"}, options);
  CHECK(dry.out.find("already succeeded") != std::string::npos);

  auto fresh = run_process({binary("dtrain"), "launch", job.path(), "--fresh"}, options);
  CHECK(fresh.exit_code == 0);
  CHECK_FALSE(fs::exists(job.run_dir() + "/model"));
  CHECK_FALSE(fs::exists(job.run_dir() + "/metrics.jsonl"));
  CHECK(count(job.log(0), "==== dtrain: attempt ") == 2);  // logs are kept and appended

  job.write(2, "--sleep 0.2");  // other work in the same run directory: it runs
  auto changed = job.launch();
  CHECK(changed.exit_code == 0);
  CHECK(changed.err.find("already succeeded") == std::string::npos);
  CHECK(count(job.log(0), "==== dtrain: attempt ") == 3);
}

TEST_CASE("a Python command job's print() reaches its log at once (PYTHONUNBUFFERED)") {
  Job job;
  std::ofstream(job.dir.path() + "/job.json")
      << R"J({"job": "t", "workers": 1, "command": ["/usr/bin/python3", "-c",
      "import time\nprint('first line', flush=False)\ntime.sleep(30)"],
      "restart": {"max_restarts": 0, "grace_seconds": 1}})J";
  auto launcher = job.launch_in_background();
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream log(job.run_dir() + "/logs/worker-0.log");
    std::stringstream text;
    text << log.rdbuf();
    seen = text.str().find("first line") != std::string::npos;
  }
  CHECK(seen);  // buffered, it would appear only at exit, 30 s later
  launcher->signal(SIGTERM);
  launcher->wait(30);
}

// Recovery in place through the real launcher, control socket and processes, with a stand-in for
// dtrain-worker found beside a copy of dtrain (as the launcher finds dtrain-worker): the two
// survivors ask to re-form before worker:1 fails, and hear generation 1 once it has; the
// replacement runs with DTRAIN_GENERATION=1; nobody else is restarted.
TEST_CASE("in place: a failed worker's replacement and the survivors' reform replies") {
  Job job;
  fs::create_directories(job.dir.path() + "/bin");
  std::string dtrain = job.dir.path() + "/bin/dtrain";
  fs::copy_file(binary("dtrain"), dtrain);
  std::string worker = job.dir.path() + "/bin/dtrain-worker";
  std::ofstream(worker) << R"PY(#!/usr/bin/python3
import json, os, socket, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
generation = int(os.environ["DTRAIN_GENERATION"])
print("worker %d generation %d recovery %s" % (index, generation,
      os.environ.get("DTRAIN_RECOVERY", "-")), flush=True)
if generation > 0:
    sys.exit(0)
if index == 1:
    time.sleep(0.5)
    sys.exit(1)
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["DTRAIN_CONTROL"][len("unix:"):])
s.sendall((json.dumps({"request": "reform", "task": "worker:%d" % index,
    "attempt": int(os.environ["DTRAIN_ATTEMPT"]), "generation": 0, "whole_step": 5,
    "what": "worker:1 (rank 1): connection closed"}) + "\n").encode())
print("reply " + s.makefile().readline().strip(), flush=True)
)PY";
  fs::permissions(worker, fs::perms::owner_all);
  std::ofstream(job.path()) << R"({"job": "t", "workers": 3,
      "restart": {"max_restarts": 1, "backoff_seconds": 0.05, "grace_seconds": 1},
      "train": {"model": {"input_shape": [2, 2, 1], "layers": [{"type": "flatten"},
                {"type": "dense", "units": 2}]},
                "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
                "optimizer": {"type": "sgd", "learning_rate": 0.1},
                "data": {"source": "synthetic", "examples": 64, "classes": 2},
                "per_worker_batch_size": 8, "epochs": 1}})";
  dtrain::testing::ProcessOptions options;
  options.cwd = job.dir.path();
  options.timeout_seconds = 60;
  auto r = run_process({dtrain, "launch", job.path()}, options);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  for (int i : {0, 2}) {
    CHECK(job.log(i).find("worker " + std::to_string(i) + " generation 0 recovery in_place") !=
          std::string::npos);
    CHECK(job.log(i).find(R"(reply {"request":"reform","ok":true,"generation":1})") !=
          std::string::npos);
    CHECK(count(job.log(i), "==== dtrain: attempt ") == 1);
  }
  CHECK(job.log(1).find(", generation 1) started ") != std::string::npos);
  CHECK(job.log(1).find("worker 1 generation 1 recovery in_place") != std::string::npos);
  CHECK(job.events().find(R"("event":"in_place","task":"worker:1","attempt":0,"generation":1,)"
                          R"("outcome":"failed","what":"exit code 1")") != std::string::npos);
  CHECK(job.state_int("attempt") == 0);
  CHECK(job.state_int("generation") == 1);
  CHECK(job.state_int("restarts") == 1);
}

namespace {

// A cgroup holding one process, frozen: the v1 freezer (which holds even SIGKILL until thawed, as
// `docker pause` does there) or else v2's cgroup.freeze. The destructor thaws it and removes the
// cgroup, whatever the test did. why says what failed when it could not be made (not root, no
// freezer).
struct FrozenCgroup {
  explicit FrozenCgroup(int pid) {
    std::string name = "/dtrain-test-" + std::to_string(::getpid());
    if (fs::is_directory("/sys/fs/cgroup/freezer")) {
      dir = "/sys/fs/cgroup/freezer" + name;
      v1 = true;
    } else if (fs::exists("/sys/fs/cgroup/cgroup.controllers")) {
      dir = "/sys/fs/cgroup" + name;
    } else {
      why = "no cgroup freezer";
      return;
    }
    std::error_code ec;
    if (!fs::create_directory(dir, ec)) {
      why = "cannot create " + dir + ": " + ec.message();
      dir.clear();
      return;
    }
    if (!write("cgroup.procs", std::to_string(pid)) ||
        !write(v1 ? "freezer.state" : "cgroup.freeze", v1 ? "FROZEN" : "1")) {
      why = "cannot move the worker into " + dir + " or freeze it";
      return;
    }
    for (int i = 0; i < 500 && !frozen; ++i) {  // FREEZING, then FROZEN
      frozen = v1 ? read("freezer.state") == "FROZEN"
                  : read("cgroup.events").find("frozen 1") != std::string::npos;
      if (!frozen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!frozen) why = dir + " did not freeze";
  }
  ~FrozenCgroup() {
    if (dir.empty()) return;
    write(v1 ? "freezer.state" : "cgroup.freeze", v1 ? "THAWED" : "0");
    // Thawed, the worker dies of the SIGKILL it holds and leaves the cgroup empty.
    for (int i = 0; i < 1000 && ::rmdir(dir.c_str()) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  bool write(const std::string& file, const std::string& text) const {
    std::ofstream out(dir + "/" + file);
    out << text << std::flush;
    return static_cast<bool>(out);
  }
  std::string read(const std::string& file) const {
    std::ifstream in(dir + "/" + file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
  }

  std::string dir, why;
  bool v1 = false;
  bool frozen = false;
};

}  // namespace

// Issue 43: a worker frozen by the cgroup freezer (`docker pause`) outlives SIGKILL until thawed,
// and the launcher stayed "stopping" until then. Now the stop is bounded: after the grace and
// kill_drain_seconds the launcher names the worker and why, records it, and exits.
TEST_CASE("a stop with a worker frozen by the cgroup freezer is bounded and names it") {
  Job job;
  job.write(2, "--sleep 100", "", R"("max_restarts": 0, "grace_seconds": 1)");
  auto launcher = job.launch_in_background();
  int w1 = job.wait_pid("worker-1-0");
  FrozenCgroup frozen(w1);
  if (!frozen.frozen) {  // a test bed: under DTRAIN_REQUIRE_TESTBEDS=1 it must run
    if (dtrain::testing::test_beds_required())
      FAIL(dtrain::testing::test_bed_missing("cgroup freezer", frozen.why));
    WARN("skipped: cgroup freezer test bed unavailable: " << frozen.why);
    return;
  }
  launcher->signal(SIGTERM);
  auto r = launcher->wait(60);  // grace 1 s + kill_drain_seconds 5 s, not until thawed
  INFO(r.out << r.err);
  CHECK(r.exit_code == 143);
  std::string said = r.out + r.err;
  CHECK(said.find("worker:1 (pid " + std::to_string(w1) + ") cannot be killed") !=
        std::string::npos);
  CHECK(said.find("its cgroup " + frozen.dir + " is frozen") != std::string::npos);
  std::string events = job.events();
  CHECK(events.find("\"event\":\"unkillable\",\"task\":\"worker:1\",\"pid\":" +
                    std::to_string(w1)) != std::string::npos);
  CHECK(job.state_string("status") == "stopped");
}

// Issue 46, item 7: TORCHELASTIC_RESTART_COUNT counts the restarts of this launch, as torchrun's
// does, while DTRAIN_ATTEMPT goes on across launches of the run directory: a failed run launched
// again starts at count 0 on attempt 1, and a restart within that launch is count 1.
TEST_CASE("TORCHELASTIC_RESTART_COUNT counts the restarts of this launch") {
  Job job;
  std::ofstream(job.path()) << R"({"job": "t", "workers": 1, "command": ["sh", "-c",
    "echo RC=$TORCHELASTIC_RESTART_COUNT A=$DTRAIN_ATTEMPT; [ $DTRAIN_ATTEMPT -ge 2 ]"],
    "restart": {"max_restarts": 0, "backoff_seconds": 0.05, "grace_seconds": 1}})";
  CHECK(job.launch().exit_code == 1);  // attempt 0 fails, no restart
  std::string text = dtrain::common::read_file(job.path());
  text.replace(text.find("\"max_restarts\": 0"), 17, "\"max_restarts\": 1");
  std::ofstream(job.path()) << text;
  auto second = job.launch();  // attempt 1 fails, attempt 2 (a restart of this launch) succeeds
  INFO(second.out << second.err);
  CHECK(second.exit_code == 0);
  const std::string log = job.log(0);
  CHECK(log.find("RC=0 A=0") != std::string::npos);
  CHECK(log.find("RC=0 A=1") != std::string::npos);
  CHECK(log.find("RC=1 A=2") != std::string::npos);
}
