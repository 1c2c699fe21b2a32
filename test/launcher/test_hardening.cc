// Issue 14, the launcher's part: how a worker that dies at once is reported, which cluster
// addresses are refused, what the launcher does to an existing run directory, where the token
// and the worker program's path may appear, handlers that fail, and a run directory that fills up.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "launcher/placement/agent_child.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/placement/process_spawner.h"
#include "test/support/processes.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain::launcher;
using dtrain::testing::binary;
using dtrain::testing::ProcessOptions;
using dtrain::testing::ProcessResult;
using dtrain::testing::run_process;
using dtrain::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// A job file in a fresh folder whose run directory is <folder>/run.
struct JobDir {
  TempDir dir;
  std::string path() const { return dir.path() + "/job.json"; }
  std::string run_dir() const { return dir.path() + "/run"; }
  /// Writes {"job": "h", <body>} with a quick restart policy unless body has its own.
  void write(const std::string& body) const {
    std::ofstream(path()) << R"({"job": "h", "run_dir": ")" << run_dir() << "\", " << body << "}";
  }
  ProcessResult launch(double timeout = 60) const {
    ProcessOptions options;
    options.cwd = dir.path();
    options.timeout_seconds = timeout;
    return run_process({binary("dtrain"), "launch", path()}, options);
  }
  std::string read(const std::string& name) const {
    return dtrain::testing::read_all(run_dir() + "/" + name);
  }
};

// A small tmpfs mounted on a fresh folder for the test's life (root only; unmounted always).
class SmallDisk {
 public:
  explicit SmallDisk(const std::string& options) {
    fs::create_directories(path_);
    if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) != 0)
      error_ = std::strerror(errno);
  }
  ~SmallDisk() {
    if (error_.empty()) ::umount2(path_.c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  /// Empty when mounted, else why not (tests skip then).
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }
  /// Writes <path>/filler until the disk is full.
  void fill() const {
    int fd = ::open((path_ + "/filler").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    std::vector<char> chunk(64 * 1024, 'x');
    while (::write(fd, chunk.data(), chunk.size()) > 0) {
    }
    ::close(fd);
  }

 private:
  TempDir dir_;
  std::string path_ = dir_.path() + "/disk";
  std::string error_;
};

constexpr const char* kQuickRestart =
    R"("restart": {"max_restarts": 1, "backoff_seconds": 0, "grace_seconds": 1})";

struct SpawnedExit {
  std::optional<ExitStatus> status;
  bool before_spawn_returned = false;
};

// Spawns argv from inside a handler of io (as a restart does) and runs io until it has exited.
SpawnedExit spawn_from_handler(const std::vector<std::string>& argv) {
  boost::asio::io_context io;
  auto spawner = make_local_spawner(io);
  SpawnedExit result;
  std::unique_ptr<Child> child;
  bool returned = false;
  boost::asio::post(io, [&] {
    ChildCallbacks callbacks;
    callbacks.on_exit = [&](const dtrain::launcher::ChildEnd& end) {
      ExitStatus status = end.status;
      result.status = status;
      result.before_spawn_returned = !returned;
    };
    child = spawner->spawn(SpawnRequest{argv, {}, "", "", std::nullopt}, std::move(callbacks));
    returned = true;
  });
  while (!result.status && io.run_one_for(std::chrono::seconds(10)) > 0) {
  }
  return result;
}

// Spawns argv with env set on top of this process's environment; returns what it printed.
std::string spawn_and_read(const std::vector<std::string>& argv,
                           const std::vector<std::pair<std::string, std::string>>& env) {
  boost::asio::io_context io;
  auto spawner = make_local_spawner(io);
  std::string output;
  bool closed = false;
  std::optional<ExitStatus> status;
  ChildCallbacks callbacks;
  callbacks.on_output = [&](std::string_view bytes) { output.append(bytes); };
  callbacks.on_output_closed = [&] { closed = true; };
  callbacks.on_exit = [&](const dtrain::launcher::ChildEnd& end) { status = end.status; };
  auto child = spawner->spawn(SpawnRequest{argv, env, "", "", std::nullopt}, std::move(callbacks));
  while (!(closed && status) && io.run_one_for(std::chrono::seconds(10)) > 0) {
  }
  REQUIRE(status.has_value());
  CHECK(describe(*status) == "exit code 0");
  return output;
}

// The same through AgentChild, as `dtrain agent` starts a worker: env split between the request's
// variables and the agent's own additions (which come last).
std::string agent_spawn_and_read(const std::vector<std::string>& argv,
                                 const std::vector<std::pair<std::string, std::string>>& env,
                                 size_t request_vars) {
  std::vector<std::pair<std::string, std::string>> request_env(env.begin(),
                                                               env.begin() + request_vars);
  std::vector<std::pair<std::string, std::string>> extra(env.begin() + request_vars, env.end());
  auto child = AgentChild::spawn(AgentRequest{argv, request_env, ""}, extra);
  std::string output;
  for (;;) {
    pollfd p{child->output_fd(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    char chunk[4096];
    ssize_t n = ::read(child->output_fd(), chunk, sizeof chunk);
    if (n <= 0) break;
    output.append(chunk, static_cast<size_t>(n));
  }
  std::optional<ExitStatus> status;
  for (int i = 0; i < 1000 && !(status = child->poll_exit()); ++i) ::usleep(10000);
  REQUIRE(status.has_value());
  CHECK(describe(*status) == "exit code 0");
  return output;
}

}  // namespace

TEST_CASE("spawner: a child that dies of a signal at once is reported as killed by that signal",
          "[hardening][spawner]") {
  // The child is often dead before the spawner has handed back its Child: Boost.Process then
  // reports the exit inside spawn(), before it has stored the status (0x17f, "exit code 383").
  for (int i = 0; i < 40; ++i) {
    SpawnedExit exit = spawn_from_handler({"/bin/sh", "-c", "kill -KILL $$"});
    REQUIRE(exit.status.has_value());
    INFO("spawn " << i << ": " << describe(*exit.status));
    CHECK_FALSE(exit.before_spawn_returned);
    REQUIRE(exit.status->signaled);
    CHECK(exit.status->signal == SIGKILL);
    CHECK(describe(*exit.status) == "killed by SIGKILL");
  }
}

TEST_CASE("spawner and agent: the child gets this environment with the request's on top",
          "[hardening][spawner][agent]") {
  // Boost 1.74's bp::environment compared a name with every entry over the name's length, reading
  // past the end of shorter entries (ASan, once TORCHELASTIC_RESTART_COUNT was set); both paths
  // now build execve's environment in start_process().
  REQUIRE(::setenv("DT_SPAWN_KEPT", "from the launcher", 1) == 0);
  REQUIRE(::setenv("DT_SPAWN_REPLACED", "old", 1) == 0);
  std::vector<std::string> argv = {
      "/bin/sh", "-c",
      "printf '%s|%s|%s|%s|' \"$DT_SPAWN_KEPT\" \"$DT_SPAWN_REPLACED\" \"$DT_SPAWN_TWICE\" "
      "\"$TORCHELASTIC_RESTART_COUNT\"; env | grep -c '^DT_SPAWN_'"};
  std::vector<std::pair<std::string, std::string>> env = {{"DT_SPAWN_REPLACED", "new"},
                                                          {"DT_SPAWN_TWICE", "first"},
                                                          {"TORCHELASTIC_RESTART_COUNT", "3"},
                                                          {"DT_SPAWN_TWICE", "second"},
                                                          {"DT_SPAWN_EMPTY", ""}};
  // Each name once: kept, replaced, twice (the last value) and the empty one.
  const std::string expected = "from the launcher|new|second|3|4\n";
  CHECK(spawn_and_read(argv, env) == expected);
  CHECK(agent_spawn_and_read(argv, env, 2) == expected);  // the agent's own wins over the request
  CHECK(agent_spawn_and_read(argv, env, env.size()) == expected);
  ::unsetenv("DT_SPAWN_KEPT");
  ::unsetenv("DT_SPAWN_REPLACED");
}

TEST_CASE("exit status: a wait status that is no end is not read as an exit code",
          "[hardening][spawner]") {
  CHECK(ExitStatus::from_wait_status(0x017f).code == -1);  // Boost's "still active"
  CHECK(describe(ExitStatus::from_wait_status(SIGSEGV)) == "killed by SIGSEGV");
  CHECK(describe(ExitStatus::from_wait_status(3 << 8)) == "exit code 3");
}

TEST_CASE("launch: a worker killed by SIGSEGV at once on a restart is named by its signal",
          "[hardening][launch]") {
  JobDir job;
  job.write(std::string(R"("workers": 4, "command": ["/bin/sh", "-c",
      "if [ \"$DTRAIN_ATTEMPT\" = 0 ]; then exit 1; fi; kill -SEGV $$"], )") +
            kQuickRestart);
  ProcessResult r = job.launch();
  INFO(r.err);
  CHECK(r.exit_code == 128 + SIGSEGV);
  CHECK(r.err.find("crashed (killed by SIGSEGV) on attempt 1") != std::string::npos);
  // Not Boost's 383 (0x17f, "still active") read as an exit code; log times may hold "383".
  CHECK(r.err.find("exit code 383") == std::string::npos);
  CHECK(r.err.find("code 383") == std::string::npos);
}

TEST_CASE("launch: an existing run directory keeps its mode; a new one is for this user only",
          "[hardening][launch]") {
  JobDir job;
  std::string shared = job.dir.path() + "/shared";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);  // like /tmp
  job.write(R"("workers": 1, "command": ["/bin/true"])");
  ProcessOptions options;
  options.cwd = job.dir.path();
  ProcessResult r =
      run_process({binary("dtrain"), "launch", job.path(), "--run-dir", shared}, options);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("is writable by other users (mode 1777)") != std::string::npos);
  struct stat info {};
  REQUIRE(::stat(shared.c_str(), &info) == 0);
  CHECK((info.st_mode & 07777) == 01777);

  r = job.launch();  // run_dir: <folder>/run, which does not exist yet
  CHECK(r.exit_code == 0);
  REQUIRE(::stat(job.run_dir().c_str(), &info) == 0);
  CHECK((info.st_mode & 077) == 0);
}

TEST_CASE("launch: a worker program under a path with ';' and a space runs, and no shell sees it",
          "[hardening][launch]") {
  JobDir job;
  // dtrain takes the dtrain-worker beside itself. Before, `popen(worker + " --gpu-count")` ran
  // this path through sh, which ran `touch pwned`.
  std::string bin = job.dir.path() + "/x;touch pwned;/a b";
  fs::create_directories(bin);
  fs::copy_file(binary("dtrain"), bin + "/dtrain");
  std::ofstream(bin + "/dtrain-worker") << "#!/bin/sh\necho \"fake worker ran: $1 $2\"\n";
  fs::permissions(bin + "/dtrain-worker", fs::perms::owner_all);
  job.write(R"("workers": 1, "train": {"model": {"input_shape": [2, 2, 1], "layers":
    [{"type": "flatten"}, {"type": "dense", "units": 2}]}, "loss": {"type":
    "sparse_categorical_crossentropy", "from_logits": true}})");
  ProcessOptions options;
  options.cwd = job.dir.path();
  ProcessResult r = run_process({bin + "/dtrain", "launch", job.path()}, options);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(job.read("logs/worker-0.log").find("fake worker ran: --config") != std::string::npos);
  CHECK_FALSE(fs::exists(job.dir.path() + "/pwned"));
  CHECK_FALSE(fs::exists(job.dir.path() + "/x"));
}

TEST_CASE("launch: the token is on no command line, and the remote shell gets -- before the host",
          "[hardening][launch]") {
  JobDir job;
  // A remote shell that notes its arguments and runs the command here: `-- HOST COMMAND...`.
  std::string shell = job.dir.path() + "/fake-ssh";
  std::ofstream(shell) << "#!/bin/sh\necho \"$@\" >> '" << job.dir.path()
                       << "/shell-args'\n[ \"$1\" = -- ] || exit 99\nshift 2\nexec sh -c \"$*\"\n";
  fs::permissions(shell, fs::perms::owner_all);
  job.write(R"("cluster": {"worker": ["127.0.0.1:1", "192.0.2.1:1"]}, "remote_shell": [")" + shell +
            R"("], "command": [")" + binary("dtrain-test-worker") + R"(", "--sleep", "3"], )" +
            kQuickRestart);
  ProcessOptions options;
  options.cwd = job.dir.path();
  dtrain::testing::BackgroundProcess launcher({binary("dtrain"), "launch", job.path()}, options);
  std::string token;
  std::vector<std::string> leaks;
  REQUIRE(dtrain::testing::wait_for(
      [&] {
        for (int pid : dtrain::testing::processes_of_run(job.run_dir())) {
          token = dtrain::testing::env_value(dtrain::testing::environment_of(pid), "DTRAIN_TOKEN");
          if (!token.empty()) return dtrain::testing::processes_of_run(job.run_dir()).size() == 2;
        }
        return false;
      },
      20));
  for (int i = 0; i < 10; ++i) {  // the workers sleep 3 s: look while they run
    for (const std::string& hit : dtrain::testing::command_lines_with({token}))
      leaks.push_back(hit);
    ::usleep(100 * 1000);
  }
  ProcessResult r = launcher.wait(60);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(token.size() == 64);
  CHECK(leaks.empty());
  std::string args = dtrain::testing::read_all(job.dir.path() + "/shell-args");
  CHECK(args.rfind("-- 192.0.2.1 '" + binary("dtrain") + "' agent", 0) == 0);
}

TEST_CASE("launch: a run directory that fills up mid-run stops the job, naming the cause",
          "[hardening][launch][disk]") {
  SmallDisk disk("size=4m,mode=0700");
  if (!disk.error().empty()) {
    WARN("cannot mount a tmpfs (" << disk.error() << "): the full-disk test is skipped");
    return;
  }
  JobDir job;
  std::string run = disk.path() + "/run";
  // Two workers print a line every 10 ms for up to a minute, with restarts allowed.
  job.write(R"("workers": 2, "command": [")" + binary("dtrain-test-worker") +
            R"(", "--tick", "0.01", "--sleep", "60"],
      "restart": {"max_restarts": 3, "backoff_seconds": 0, "grace_seconds": 5})");
  ProcessOptions options;
  options.cwd = job.dir.path();
  options.timeout_seconds = 90;
  dtrain::testing::BackgroundProcess launcher(
      {binary("dtrain"), "launch", job.path(), "--run-dir", run}, options);
  REQUIRE(dtrain::testing::wait_for(
      [&] { return dtrain::testing::processes_of_run(run).size() == 2; }, 20));
  disk.fill();
  ProcessResult r = launcher.wait(90);
  INFO(r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  // The summary names the launcher's own write and the cause, and there was no restart.
  CHECK(r.err.find("failed: launcher: cannot write " + run + "/logs/worker-") != std::string::npos);
  CHECK(r.err.find(": No space left on device\n") != std::string::npos);
  std::string state = dtrain::testing::read_all(run + "/state.json");
  CHECK(state.find("\"status\":\"failed\"") != std::string::npos);
  CHECK(state.find("No space left on device") != std::string::npos);
  std::string events = dtrain::testing::read_all(run + "/events.jsonl");
  CHECK(events.find("\"event\":\"end\"") != std::string::npos);
  CHECK(events.find("\"event\":\"restart\"") == std::string::npos);
  CHECK(dtrain::testing::processes_of_run(run).empty());
  CHECK_FALSE(fs::exists(run + "/launcher.reserve"));
}

// Issue 25 (2): a launcher that ran out of descriptors part-way through spawning once hung for
// ever (a worker recorded with pid -1, state "stopping", SIGTERM ignored). Under a hard limit of
// 60-69 descriptors the ports of 40 workers can be picked (held at once, then closed) but not all
// their logs and output pipes opened: spawning fails after about 25 workers, at a point that moves
// with the limit. The launch must end, name the cause and leave no worker behind.
TEST_CASE("launch: running out of descriptors while spawning ends the launch, leaving no worker",
          "[hardening][launch][fds]") {
  for (int limit : {60, 63, 66, 69}) {
    JobDir job;
    job.write(R"("workers": 40, "command": ["/bin/sleep", "30"],
        "restart": {"max_restarts": 0, "backoff_seconds": 0, "grace_seconds": 2})");
    ProcessOptions options;
    options.cwd = job.dir.path();
    options.timeout_seconds = 60;
    // The shell's `ulimit -n` sets the soft and the hard limit: the launcher cannot raise it.
    ProcessResult r = run_process(
        {"/bin/sh", "-c", "ulimit -n " + std::to_string(limit) + " && exec \"$0\" \"$@\"",
         binary("dtrain"), "launch", job.path()},
        options);
    INFO("limit " << limit << ": " << r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("first failure: worker:") != std::string::npos);
    CHECK(r.err.find("Too many open files") != std::string::npos);
    CHECK(dtrain::testing::wait_for(
        [&] { return dtrain::testing::processes_of_run(job.run_dir()).empty(); }, 5));
  }
}

// Issue 25 (10): "workers" goes up to 4096 (the spawn benchmark's largest job).
TEST_CASE("job file: \"workers\" may be 4096 but not 4097", "[hardening][job_spec]") {
  using dtrain::common::parse_job_spec;
  CHECK(parse_job_spec(R"({"job": "j", "workers": 4096, "command": ["/bin/true"]})", "x")
            .auto_workers == 4096);
  CHECK_THROWS_WITH(
      parse_job_spec(R"({"job": "j", "workers": 4097, "command": ["/bin/true"]})", "x"),
      Catch::Contains("from 1 to 4096"));
}
