// `dtrain logs`: LogFollower's pieces on real files in-process, and the real dtrain binary printing
// and following logs that the test appends to. No timing thresholds: waits only have generous
// time-outs, and a short sleep only makes a partial line likely to be read in two pieces.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/run_dir.h"
#include "launcher/view/log_follower.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using dtrain::common::RunDir;
using dtrain::common::TaskId;
using dtrain::launcher::LineSink;
using dtrain::testing::binary;
using dtrain::testing::run_process;
using dtrain::testing::TempDir;

namespace {

constexpr double kGenerousSeconds = 10;

void append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::app) << text;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// A run directory with logs/ (unless told otherwise) under a fresh temporary folder.
struct TestRun {
  explicit TestRun(bool with_logs = true) : run(dir.path() + "/run") {
    std::filesystem::create_directories(with_logs ? run.logs_dir() : run.root());
  }
  std::string log(const std::string& type, int index) const { return run.log_file({type, index}); }
  void write_state(const std::string& status, int pid) const {
    dtrain::common::write_file_atomically(
        run.state_json(),
        "{\"status\": \"" + status + "\", \"launcher_pid\": " + std::to_string(pid) + "}\n");
  }
  TempDir dir;
  RunDir run;
};

std::string header(int attempt) {
  return dtrain::common::attempt_header(attempt, TaskId{"worker", 0}, 4242 + attempt,
                                        "2026-11-21T19:45:00.000Z");
}

/// The pid of a process that has exited and been reaped.
int dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

bool wait_until(const std::function<bool()>& done, double seconds = kGenerousSeconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// A program running in the background with stdout and stderr to files; SIGKILLed if the test
/// leaves it running.
class Background {
 public:
  Background(const std::vector<std::string>& argv, const std::string& out_path)
      : out_path_(out_path) {
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      FILE* out = std::freopen(out_path.c_str(), "w", stdout);
      FILE* err = std::freopen((out_path + ".err").c_str(), "w", stderr);
      if (out == nullptr || err == nullptr) ::_exit(126);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  /// Exit code, or nullopt when still running after seconds.
  std::optional<int> wait(double seconds = kGenerousSeconds) {
    int status = 0;
    bool exited = wait_until([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, seconds);
    if (!exited) return std::nullopt;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void signal(int number) const { ::kill(pid_, number); }
  std::string out() const { return slurp(out_path_); }
  std::string err() const { return slurp(out_path_ + ".err"); }
  bool printed(const std::string& text) const {
    return wait_until([&] { return out().find(text) != std::string::npos; });
  }

 private:
  std::string out_path_;
  pid_t pid_ = -1;
};

/// Collects "role|text" lines.
struct Collect : LineSink {
  void line(const TaskId& task, std::string_view text) override {
    lines.push_back(dtrain::common::role_name(task.type, task.index) + "|" + std::string(text));
  }
  void flush() override { ++flushes; }
  std::vector<std::string> lines;
  int flushes = 0;
};

bool one_line(const std::string& text) {
  return !text.empty() && text.find('\n') == text.size() - 1;
}

}  // namespace

TEST_CASE("LogLineSplitter cuts at \\n and \\r and holds the partial line") {
  dtrain::launcher::LogLineSplitter splitter;
  std::vector<std::string> out;
  splitter.feed("one\n\ntwo\r\n\r 10%\r 20%\nthr", out);
  CHECK(out == std::vector<std::string>{"one", "", "two", " 10%", " 20%"});
  CHECK(splitter.take_partial() == "thr");
  CHECK(splitter.take_partial() == std::nullopt);
  out.clear();
  splitter.feed("ee\r", out);
  splitter.feed("\nfour\n", out);  // "\r\n" split across two reads is still one line end
  CHECK(out == std::vector<std::string>{"ee", "four"});
}

TEST_CASE("log files are found by name and ordered chief, workers by index, evaluator") {
  TestRun t;
  for (const char* name : {"worker-10.log", "evaluator-0.log", "worker-2.log", "chief-0.log",
                           "worker-1.log.old", "notes.txt", "worker-x.log"}) {
    append(t.run.logs_dir() + "/" + name, "x\n");
  }
  std::vector<std::string> names;
  for (const auto& f : dtrain::launcher::find_log_files(t.run)) names.push_back(f.task.text());
  CHECK(names == std::vector<std::string>{"chief:0", "worker:2", "worker:10", "evaluator:0"});
  CHECK(dtrain::launcher::find_log_files(RunDir(t.dir.path() + "/none")).empty());
}

TEST_CASE("LogReader reads the last lines of a big file, then only what is appended") {
  TestRun t;
  std::string path = t.log("worker", 0);
  std::string text;
  for (int i = 0; i < 30000; ++i) text += "line " + std::to_string(i) + (i % 7 ? "\n" : "\r\n");
  append(path, text + "held");
  for (size_t n : {size_t{0}, size_t{3}, size_t{20000}}) {
    INFO("n = " << n);
    Collect sink;
    dtrain::launcher::LogReader reader({{"worker", 0}, path});
    reader.read_tail(n, sink);
    REQUIRE(sink.lines.size() == n);
    if (n > 0) CHECK(sink.lines.front() == "worker 0|line " + std::to_string(30000 - n));
    if (n > 0) CHECK(sink.lines.back() == "worker 0|line 29999");
  }
  Collect sink;
  dtrain::launcher::LogReader reader({{"worker", 0}, path});
  reader.read_tail(1, sink);
  append(path, " back\nnext\n");
  reader.read_new(sink);
  reader.flush_partial(sink);
  CHECK(sink.lines ==
        std::vector<std::string>{"worker 0|line 29999", "worker 0|held back", "worker 0|next"});
}

TEST_CASE("run_is_over reads state.json: final status, or the launcher gone") {
  TestRun t;
  CHECK_FALSE(dtrain::launcher::run_is_over(t.run));  // not written yet
  dtrain::common::write_file_atomically(t.run.state_json(), "{\"status\": ");
  CHECK_FALSE(dtrain::launcher::run_is_over(t.run));  // unreadable
  t.write_state("running", ::getpid());
  CHECK_FALSE(dtrain::launcher::run_is_over(t.run));
  t.write_state("backing off", dead_pid());
  CHECK(dtrain::launcher::run_is_over(t.run));
  for (const char* status : {"succeeded", "failed", "stopped"}) {
    t.write_state(status, ::getpid());
    CHECK(dtrain::launcher::run_is_over(t.run));
  }
}

TEST_CASE("LogFollower::follow stops on its stop descriptor and prints held partial lines") {
  TestRun t;
  t.write_state("running", ::getpid());
  append(t.log("worker", 1), "w1 a\nw1 b\nw1 partial");
  append(t.log("chief", 0), "c a\n");
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  REQUIRE(::write(pipe_fds[1], "x", 1) == 1);
  Collect sink;
  dtrain::launcher::LogFollower follower(t.run, std::nullopt, sink);
  follower.follow(1, pipe_fds[0]);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  CHECK(sink.lines ==
        std::vector<std::string>{"chief|c a", "worker 1|w1 b", "worker 1|w1 partial"});
  CHECK(sink.flushes >= 2);
}

TEST_CASE("dtrain logs prints every line of each log with its prefix, in task order") {
  TestRun t;
  t.write_state("succeeded", dead_pid());
  append(t.log("worker", 1), header(1) + "\nw1 a\nstep 1\rstep 2\nw1 b\n");
  append(t.log("worker", 0), header(1) + "\nw0 a\nw0 b\nw0 c\n");
  std::string dtrain = binary("dtrain");

  auto all = run_process({dtrain, "logs", t.run.root()});
  CHECK(all.exit_code == 0);
  CHECK(all.out == "[worker 0] " + header(1) + "\n[worker 0] w0 a\n[worker 0] w0 b\n" +
                       "[worker 0] w0 c\n[worker 1] " + header(1) + "\n[worker 1] w1 a\n" +
                       "[worker 1] step 1\n[worker 1] step 2\n[worker 1] w1 b\n");
  auto last2 = run_process({dtrain, "logs", t.run.root(), "-n", "2"});
  CHECK(last2.exit_code == 0);
  CHECK(last2.out == "[worker 0] w0 b\n[worker 0] w0 c\n[worker 1] step 2\n[worker 1] w1 b\n");
  auto one = run_process({dtrain, "logs", t.run.root(), "--worker", "1", "--lines", "3"});
  CHECK(one.exit_code == 0);
  CHECK(one.out == "[worker 1] step 1\n[worker 1] step 2\n[worker 1] w1 b\n");
  auto raw = run_process({dtrain, "logs", t.run.root(), "--worker", "0", "--raw", "-n", "2"});
  CHECK(raw.exit_code == 0);
  CHECK(raw.out == "w0 b\nw0 c\n");

  append(t.log("chief", 0), "chief line\n");
  append(t.log("evaluator", 0), "eval line\nno end");
  auto every = run_process({dtrain, "logs", t.run.root(), "-n", "1"});
  CHECK(every.out == "[chief] chief line\n[worker 0] w0 c\n[worker 1] w1 b\n[evaluator] no end\n");
  auto task = run_process({dtrain, "logs", t.run.root(), "--task", "evaluator:0"});
  CHECK(task.out == "[evaluator] eval line\n[evaluator] no end\n");
}

TEST_CASE("dtrain logs finds the run from a job file or the only run under ./runs") {
  TempDir cwd;
  std::filesystem::create_directories(cwd.path() + "/runs/only/logs");
  append(cwd.path() + "/runs/only/logs/worker-0.log", "hello\n");
  dtrain::testing::ProcessOptions in_cwd;
  in_cwd.cwd = cwd.path();
  auto by_default = run_process({binary("dtrain"), "logs"}, in_cwd);
  CHECK(by_default.exit_code == 0);
  CHECK(by_default.out == "[worker 0] hello\n");

  std::string job = cwd.path() + "/job.json";
  append(job, R"({"job": "j", "workers": 1, "command": ["true"], "run_dir": "runs/only"})");
  auto by_job = run_process({binary("dtrain"), "logs", job}, in_cwd);
  CHECK(by_job.exit_code == 0);
  CHECK(by_job.out == "[worker 0] hello\n");

  std::filesystem::create_directories(cwd.path() + "/runs/second");
  auto ambiguous = run_process({binary("dtrain"), "logs"}, in_cwd);
  CHECK(ambiguous.exit_code == 2);
  CHECK(one_line(ambiguous.err));
  CHECK(ambiguous.err.find("RUN_DIR") != std::string::npos);
}

TEST_CASE("dtrain logs -f prints appended lines once, joins partial lines, ends with the run") {
  TestRun t;
  t.write_state("running", ::getpid());
  std::string log = t.log("worker", 0);
  append(log, header(1) + "\nline 1\n");
  append(t.log("worker", 1), "not selected\n");
  Background logs({binary("dtrain"), "logs", t.run.root(), "-f", "--worker", "0"},
                  t.dir.path() + "/out");
  REQUIRE(logs.printed("line 1\n"));
  append(log, "line 2\n" + header(2) + "\npar");
  REQUIRE(logs.printed("line 2\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // "par" read on its own, likely
  append(log, "tial\n");
  REQUIRE(logs.printed("partial\n"));
  append(log, "no newline at the end");
  t.write_state("succeeded", ::getpid());

  REQUIRE(logs.wait() == 0);
  CHECK(logs.out() == "[worker 0] " + header(1) + "\n[worker 0] line 1\n[worker 0] line 2\n" +
                          "[worker 0] " + header(2) + "\n[worker 0] partial\n" +
                          "[worker 0] no newline at the end\n");
  CHECK(logs.err().empty());
}

TEST_CASE("dtrain logs -f picks up log files created after it started") {
  TestRun t;
  t.write_state("running", ::getpid());
  append(t.log("worker", 0), "w0 first\n");
  Background all({binary("dtrain"), "logs", t.run.root(), "-f"}, t.dir.path() + "/all");
  Background one({binary("dtrain"), "logs", t.run.root(), "-f", "--worker", "1"},
                 t.dir.path() + "/one");
  REQUIRE(all.printed("[worker 0] w0 first\n"));
  append(t.log("worker", 1), "w1 first\nw1 second\n");
  REQUIRE(all.printed("[worker 1] w1 second\n"));
  REQUIRE(one.printed("[worker 1] w1 second\n"));
  append(t.log("worker", 0), "w0 second\n");
  REQUIRE(all.printed("[worker 0] w0 second\n"));
  t.write_state("running", dead_pid());  // the launcher is gone without saying so

  REQUIRE(all.wait() == 0);
  REQUIRE(one.wait() == 0);
  CHECK(all.out() ==
        "[worker 0] w0 first\n[worker 1] w1 first\n[worker 1] w1 second\n"
        "[worker 0] w0 second\n");
  CHECK(one.out() == "[worker 1] w1 first\n[worker 1] w1 second\n");
}

TEST_CASE("dtrain logs -f waits for logs/ to appear and ends cleanly on SIGTERM") {
  TestRun t(/*with_logs=*/false);
  Background logs({binary("dtrain"), "logs", t.run.root(), "-f"}, t.dir.path() + "/out");
  std::filesystem::create_directories(t.run.logs_dir());
  append(t.log("chief", 0), "chief up\nhalf");
  REQUIRE(logs.printed("[chief] chief up\n"));
  logs.signal(SIGTERM);
  REQUIRE(logs.wait() == 0);
  CHECK(logs.out() == "[chief] chief up\n[chief] half\n");
}

TEST_CASE("dtrain logs: a missing run directory or log file is exit 2 with one line") {
  TestRun t;
  std::string dtrain = binary("dtrain");
  auto missing = run_process({dtrain, "logs", t.dir.path() + "/nope"});
  CHECK(missing.exit_code == 2);
  CHECK(one_line(missing.err));
  CHECK(missing.err.find(t.dir.path() + "/nope: no such run directory") != std::string::npos);

  append(t.log("worker", 0), "w0\n");
  t.write_state("failed", ::getpid());
  for (bool follow : {false, true}) {
    INFO("follow: " << follow);
    std::vector<std::string> argv = {dtrain, "logs", t.run.root(), "--worker", "5"};
    if (follow) argv.push_back("-f");
    auto r = run_process(argv, {{}, "", kGenerousSeconds, ""});
    CHECK(r.exit_code == 2);
    CHECK(one_line(r.err));
    CHECK(r.err.find(t.log("worker", 5)) != std::string::npos);
  }
  auto bad_lines = run_process({dtrain, "logs", t.run.root(), "-n", "-3"});
  CHECK(bad_lines.exit_code == 2);
  CHECK(one_line(bad_lines.err));
  auto bad_task = run_process({dtrain, "logs", t.run.root(), "--task", "chief"});
  CHECK(bad_task.exit_code == 2);
  CHECK(one_line(bad_task.err));
}
