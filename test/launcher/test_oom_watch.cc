// OomWatch: finding this process's memory cgroup from /proc texts (v2, v1, a container's
// sub-tree mount), the oom_kill counter of both file formats, the message for a SIGKILL with a
// risen counter, and, as root, a real OOM kill in a child cgroup with a small memory limit.
// Without root or a writable memory cgroup the real test skips with a message; with
// DTRAIN_REQUIRE_TESTBEDS=1 that is a failure.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "launcher/process/oom_watch.h"
#include "test/support/temp_dir.h"

using namespace dtrain::launcher;
namespace fs = std::filesystem;

namespace {

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

}  // namespace

TEST_CASE("the OOM watch finds this process's memory cgroup in v2, v1 and sub-tree mounts") {
  dtrain::testing::TempDir t;
  const std::string v2 = t.path() + "/v2", v1 = t.path() + "/v1";
  write_file(v2 + "/user.slice/job/memory.events",
             "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n");
  write_file(v1 + "/docker/abc/memory.oom_control",
             "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n");
  const std::string mountinfo =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "35 31 0:32 / " +
      v1 +
      " rw,relatime - cgroup cgroup rw,cpu,memory\n"
      "41 31 0:38 / " +
      v2 + " rw,relatime - cgroup2 cgroup2 rw\n";

  OomWatch unified = OomWatch::from_proc_files("0::/user.slice/job\n", mountinfo);
  CHECK(unified.counter_file() == v2 + "/user.slice/job/memory.events");
  CHECK(unified.kills() == 2u);
  CHECK(unified.counter_name() == "memory.events oom_kill");

  // Hybrid: the v2 hierarchy has no memory controller here, so the v1 memory hierarchy counts.
  OomWatch hybrid = OomWatch::from_proc_files("4:cpu,memory:/docker/abc\n0::/\n", mountinfo);
  CHECK(hybrid.counter_file() == v1 + "/docker/abc/memory.oom_control");
  CHECK(hybrid.kills() == 5u);
  CHECK(hybrid.counter_name() == "memory.oom_control oom_kill");

  // A container sees only its own sub-tree mounted: the mount's root is cut from the path.
  const std::string sub =
      "35 31 0:32 /docker/abc " + v1 + "/docker/abc rw - cgroup cgroup rw,memory\n";
  CHECK(OomWatch::from_proc_files("4:memory:/docker/abc\n", sub).kills() == 5u);

  OomWatch none = OomWatch::from_proc_files("0::/\n", "");
  CHECK(none.counter_file().empty());
  CHECK_FALSE(none.kills());
  CHECK_FALSE(OomWatch::for_cgroup(t.path() + "/nothing").kills());
}

TEST_CASE("only a SIGKILL with a risen oom_kill counter is called an OOM kill") {
  ExitStatus sigkill = ExitStatus::killed(SIGKILL);
  CHECK(oom_kill_cause(sigkill, 3, 4) ==
        std::string("killed by the kernel's OOM killer (memory.events oom_kill rose)"));
  CHECK(oom_kill_cause(ExitStatus::exited(137), 0, 1, "memory.oom_control oom_kill") ==
        std::string("killed by the kernel's OOM killer (memory.oom_control oom_kill rose)"));
  CHECK_FALSE(oom_kill_cause(sigkill, 4, 4));
  CHECK_FALSE(oom_kill_cause(sigkill, std::nullopt, 4));
  CHECK_FALSE(oom_kill_cause(sigkill, 4, std::nullopt));
  CHECK_FALSE(oom_kill_cause(ExitStatus::killed(SIGTERM), 3, 4));
  CHECK_FALSE(oom_kill_cause(ExitStatus::exited(1), 3, 4));
}

namespace {

bool require_testbeds() {
  const char* value = std::getenv("DTRAIN_REQUIRE_TESTBEDS");
  return value != nullptr && std::string(value) == "1";
}

// A memory cgroup of its own, removed (after its processes are gone) when the test ends.
class ScratchCgroup {
 public:
  explicit ScratchCgroup(std::string dir) : dir_(std::move(dir)) {}
  ~ScratchCgroup() { ::rmdir(dir_.c_str()); }
  const std::string& dir() const { return dir_; }
  // Writes a control file; false when the kernel refuses.
  bool set(const std::string& file, const std::string& value) const {
    std::ofstream out(dir_ + "/" + file);
    out << value;
    out.flush();
    return out.good();
  }

 private:
  std::string dir_;
};

// Where a child cgroup with a memory limit can go: the v2 root (whose subtree_control must
// offer memory) or this process's v1 memory cgroup. "" with why in problem otherwise.
std::string cgroup_parent(std::string& problem) {
  if (::geteuid() != 0) {
    problem = "not root";
    return "";
  }
  std::ifstream controls("/sys/fs/cgroup/cgroup.subtree_control");
  std::string words;
  std::getline(controls, words);
  if (controls && (" " + words + " ").find(" memory ") != std::string::npos)
    return "/sys/fs/cgroup";
  OomWatch self = OomWatch::for_this_process();
  if (!self.kills() || fs::path(self.counter_file()).filename() != "memory.oom_control") {
    problem =
        "no cgroup v2 memory controller at /sys/fs/cgroup and no v1 memory cgroup with an "
        "oom_kill counter (" +
        self.counter_file() + ")";
    return "";
  }
  return fs::path(self.counter_file()).parent_path().string();
}

// Joins cgroup (v2 cgroup.procs, v1 cgroup.procs) and touches memory until killed; exit 0 if
// 1 GiB fits. Only system calls after fork.
[[noreturn]] void allocate_until_killed(const std::string& procs) {
  int fd = ::open(procs.c_str(), O_WRONLY);
  char pid[32];
  int n = std::snprintf(pid, sizeof pid, "%d\n", static_cast<int>(::getpid()));
  if (fd < 0 || ::write(fd, pid, n) != n) ::_exit(3);
  ::close(fd);
  for (int i = 0; i < 1024; ++i) {
    void* block =
        ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) ::_exit(4);
    std::memset(block, 1, 1 << 20);
  }
  ::_exit(0);
}

}  // namespace

TEST_CASE("a process OOM-killed in a cgroup with a small memory limit raises the counter") {
  std::string problem;
  std::string parent = cgroup_parent(problem);
  if (parent.empty()) {
    std::string message = "cannot make a memory cgroup here (" + problem + ")";
    if (require_testbeds()) FAIL(message + "; DTRAIN_REQUIRE_TESTBEDS=1");
    WARN("skipped: " + message);
    return;
  }
  ScratchCgroup cgroup(parent + "/dtrain-oom-test-" + std::to_string(::getpid()));
  REQUIRE(::mkdir(cgroup.dir().c_str(), 0755) == 0);
  bool v2 = fs::exists(cgroup.dir() + "/memory.max");
  if (v2) {
    REQUIRE(cgroup.set("memory.max", "33554432"));
    cgroup.set("memory.swap.max", "0");  // absent without swap accounting
  } else {
    REQUIRE(cgroup.set("memory.limit_in_bytes", "33554432"));
    cgroup.set("memory.memsw.limit_in_bytes", "33554432");  // absent without swap accounting
  }
  OomWatch watch = OomWatch::for_cgroup(cgroup.dir());
  INFO(watch.counter_file());
  std::optional<uint64_t> before = watch.kills();
  REQUIRE(before == 0u);

  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) allocate_until_killed(cgroup.dir() + "/cgroup.procs");
  int wait_status = 0;
  REQUIRE(::waitpid(child, &wait_status, 0) == child);
  ExitStatus end = ExitStatus::from_wait_status(wait_status);
  INFO(describe(end));
  REQUIRE(killed_by_sigkill(end));
  CHECK(watch.kills() == 1u);
  std::optional<std::string> why = watch.explain(end, before);
  REQUIRE(why);
  CHECK(*why == "killed by the kernel's OOM killer (" +
                    std::string(v2 ? "memory.events" : "memory.oom_control") + " oom_kill rose)");
  // A later SIGKILL that the counter does not explain is no OOM kill.
  CHECK_FALSE(watch.explain(ExitStatus::killed(SIGKILL), watch.kills()));
}
