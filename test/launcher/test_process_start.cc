// start_process(), the one routine that starts a program, seen through both of its callers: the
// launcher's spawner (make_local_spawner) and the agent's AgentChild report the same errors in the
// same words. Also its own promises: group or session, stdin, signals, parent death, and running
// out of descriptors. The environment through both callers is in test_hardening.cc.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/unique_fd.h"
#include "launcher/placement/agent_child.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/placement/process_spawner.h"
#include "launcher/process/process_start.h"
#include "test/support/processes.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain::launcher;
using dtrain::common::ConfigError;
using dtrain::common::IoError;
using dtrain::common::UniqueFd;
using dtrain::testing::process_alive;
using dtrain::testing::TempDir;

namespace {

// A start of argv with everything else as ProcessStart defaults it.
ProcessStart argv_only(std::vector<std::string> argv) {
  ProcessStart start;
  start.argv = std::move(argv);
  return start;
}

// "config: <message>", "io: <message>" or "started" for what spawning argv in cwd did.
template <typename Spawn>
std::string outcome(Spawn spawn) {
  try {
    spawn();
    return "started";
  } catch (const ConfigError& e) {
    return std::string("config: ") + e.what();
  } catch (const IoError& e) {
    return std::string("io: ") + e.what();
  }
}

std::string spawner_outcome(const std::vector<std::string>& argv, const std::string& cwd = "") {
  boost::asio::io_context io;
  auto spawner = make_local_spawner(io);
  return outcome([&] { spawner->spawn(SpawnRequest{argv, {}, cwd, "", std::nullopt}, {}); });
}

std::string agent_outcome(const std::vector<std::string>& argv, const std::string& cwd = "") {
  return outcome([&] { AgentChild::spawn(AgentRequest{argv, {}, cwd}, {}); });
}

// Everything fd gives until its end (at most 10 s), then reaps pid; returns the output.
std::string read_and_reap(StartedProcess& started) {
  std::string text;
  for (;;) {
    pollfd p{started.output.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    char chunk[4096];
    ssize_t n = ::read(started.output.get(), chunk, sizeof chunk);
    if (n <= 0) break;
    text.append(chunk, static_cast<size_t>(n));
  }
  REQUIRE(::waitpid(started.pid, nullptr, 0) == started.pid);
  return text;
}

// The hex mask on a "Name:\t<hex>" line of /proc/<pid>/status text.
unsigned long long status_mask(const std::string& status, const std::string& name) {
  size_t at = status.find(name + ":\t");
  REQUIRE(at != std::string::npos);
  return std::stoull(status.substr(at + name.size() + 2, 16), nullptr, 16);
}

// Puts RLIMIT_NOFILE back as it was when the test ends, however it ends.
struct RestoreOpenFileLimit {
  rlimit saved{};
  RestoreOpenFileLimit() { REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0); }
  ~RestoreOpenFileLimit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};

}  // namespace

TEST_CASE("start: the spawner and the agent word a missing program and folder the same",
          "[process_start]") {
  TempDir dir;
  std::string missing_dir = dir.path() + "/no-such-folder";
  std::string script = dir.path() + "/not-executable.sh";
  std::ofstream(script) << "#!/bin/sh\necho hi\n";
  std::string bad_interpreter = dir.path() + "/bad-interpreter.sh";
  std::ofstream(bad_interpreter) << "#!/no/such/interpreter\n";
  REQUIRE(::chmod(bad_interpreter.c_str(), 0755) == 0);
  struct Case {
    std::vector<std::string> argv;
    std::string cwd;
    std::string expected;
  };
  std::vector<Case> cases = {
      Case{{"no-such-program-dtrain"},
           "",
           "config: " + program_not_found_message("no-such-program-dtrain")},
      Case{{"/no/such/program"}, "", "config: program \"/no/such/program\" does not exist"},
      Case{{"./no-such-program"},
           dir.path(),
           "config: program \"./no-such-program\" does not exist"},
      Case{{"/bin/true"},
           missing_dir,
           "config: cannot enter the working folder \"" + missing_dir +
               "\" to run \"/bin/true\": No such file or directory"},
      Case{{script}, "", "config: cannot run \"" + script + "\": Permission denied"},
      Case{{bad_interpreter},
           "",
           "config: cannot run \"" + bad_interpreter +
               "\": No such file or directory (its #! interpreter or its loader is missing)"}};
  CHECK(program_not_found_message("no-such-program-dtrain") ==
        "program \"no-such-program-dtrain\" not found on PATH");
  for (const Case& c : cases) {
    INFO(c.argv[0] << " in \"" << c.cwd << "\"");
    CHECK(spawner_outcome(c.argv, c.cwd) == c.expected);
    CHECK(agent_outcome(c.argv, c.cwd) == c.expected);
  }
}

TEST_CASE("start: a name is looked up on the child's PATH, relative entries from its cwd",
          "[process_start]") {
  TempDir dir;
  REQUIRE(::mkdir((dir.path() + "/bin").c_str(), 0755) == 0);
  std::string tool = dir.path() + "/bin/dtrain-test-tool";
  std::ofstream(tool) << "#!/bin/sh\necho \"tool ran in $PWD\"\n";
  REQUIRE(::chmod(tool.c_str(), 0755) == 0);
  ProcessStart start{{"dtrain-test-tool"}, {{"PATH", "bin:/usr/bin:/bin"}}, dir.path()};
  StartedProcess started = start_process(start);
  CHECK(read_and_reap(started) == "tool ran in " + dir.path() + "\n");
  start.cwd = "";  // bin/ is no longer there to be found
  CHECK_THROWS_WITH(start_process(start), program_not_found_message("dtrain-test-tool"));
}

TEST_CASE("start: a new group (or session), stdin as asked, no blocked or ignored signals",
          "[process_start]") {
  SECTION("a new process group in this session, stdin from /dev/null") {
    StartedProcess started = start_process(argv_only({"sh", "-c", "sleep 5 & wait"}));
    CHECK(::getpgid(started.pid) == started.pid);
    CHECK(::getsid(started.pid) == ::getsid(0));
    ::killpg(started.pid, SIGKILL);  // sh and its sleep: the whole group
    read_and_reap(started);
  }
  SECTION("a new session, stdin from a given descriptor") {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    UniqueFd read_end(fds[0]), write_end(fds[1]);
    REQUIRE(::write(write_end.get(), "hello", 5) == 5);
    write_end.reset();
    ProcessStart start = argv_only({"sh", "-c", "cat; echo \" $(cut -d' ' -f6 /proc/$$/stat)\""});
    start.stdin_fd = read_end.get();
    start.new_session = true;
    StartedProcess started = start_process(start);
    std::string out = read_and_reap(started);
    CHECK(out == "hello " + std::to_string(started.pid) + "\n");
  }
  SECTION("signals this process blocks or ignores (SIGPIPE) are not so in the child") {
    sigset_t usr1, old;
    ::sigemptyset(&usr1);
    ::sigaddset(&usr1, SIGUSR1);
    REQUIRE(::sigprocmask(SIG_BLOCK, &usr1, &old) == 0);
    auto old_pipe = ::signal(SIGPIPE, SIG_IGN);
    StartedProcess started = start_process(argv_only({"cat", "/proc/self/status"}));
    ::signal(SIGPIPE, old_pipe);
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    std::string status = read_and_reap(started);
    CHECK(status_mask(status, "SigBlk") == 0);
    CHECK((status_mask(status, "SigIgn") & (1ull << (SIGPIPE - 1))) == 0);
  }
}

TEST_CASE("start: the child dies when its parent is SIGKILLed", "[process_start]") {
  bool new_session = GENERATE(false, true);
  INFO((new_session ? "new session" : "new group"));
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  pid_t parent = ::fork();
  REQUIRE(parent >= 0);
  if (parent == 0) {  // the parent to be killed: starts sleep, tells its pid, waits
    ProcessStart start = argv_only({"sleep", "1000"});
    start.new_session = new_session;
    try {
      pid_t pid = start_process(start).pid;
      (void)!::write(write_end.get(), &pid, sizeof pid);
    } catch (const std::exception&) {
      ::_exit(1);
    }
    ::pause();
    ::_exit(0);
  }
  write_end.reset();
  pid_t child = -1;
  pollfd p{read_end.get(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10000) == 1);
  REQUIRE(::read(read_end.get(), &child, sizeof child) == sizeof child);
  REQUIRE(process_alive(child));
  ::kill(parent, SIGKILL);
  REQUIRE(::waitpid(parent, nullptr, 0) == parent);
  CHECK(dtrain::testing::wait_for([&] { return !process_alive(child); }, 2));
}

TEST_CASE("start: no descriptors left is an IoError naming the cause, and no process",
          "[process_start]") {
  boost::asio::io_context io;  // made first: it needs descriptors of its own
  auto spawner = make_local_spawner(io);
  RestoreOpenFileLimit restore;
  rlimit low = restore.saved;
  low.rlim_cur = 256;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<UniqueFd> filler;
  for (;;) {
    int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    filler.emplace_back(fd);
  }
  REQUIRE(errno == EMFILE);
  filler.pop_back();  // room for stdin, none for the output pipe
  std::string expected =
      "io: cannot start \"true\": a pipe for its output: Too many open files (raise the open-file "
      "limit, ulimit -n)";
  // Caught now, read once descriptors are back: UBSan checks a virtual call's object through a
  // pipe, which it cannot make with none left (a false "invalid vptr").
  std::exception_ptr direct, spawned;
  try {
    start_process(argv_only({"true"}));
  } catch (...) {
    direct = std::current_exception();
  }
  try {
    spawner->spawn(SpawnRequest{{"true"}, {}, "", "", std::nullopt}, {});
  } catch (...) {
    spawned = std::current_exception();
  }
  filler.clear();
  CHECK(outcome([&] {
          if (direct) std::rethrow_exception(direct);
        }) == expected);
  CHECK(outcome([&] {
          if (spawned) std::rethrow_exception(spawned);
        }) == expected);
}

TEST_CASE("start: raise_open_file_limit lifts the soft limit to the hard one", "[process_start]") {
  RestoreOpenFileLimit restore;
  rlimit low = restore.saved;
  low.rlim_cur = std::min<rlim_t>(low.rlim_max, 256);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  CHECK(raise_open_file_limit() == restore.saved.rlim_max);
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &now) == 0);
  CHECK(now.rlim_cur == restore.saved.rlim_max);
}
