// `dtrain agent` run by a test with its stdin and stdout on pipes, and helpers to read what it
// writes (marker lines, events, the worker's process group). Shared by the agent's tests
// (test_agent.cc, test_agent_relay.cc); Linux only (/proc).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/unique_fd.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/process/line_splitter.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

namespace dtrain::testing::agent {

using common::monotonic_seconds;
using common::UniqueFd;
using launcher::AgentLine;
using launcher::kEventMarker;
namespace fs = std::filesystem;

inline constexpr const char* kTfConfig =
    R"({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0}})";

// `dtrain agent` with its stdin and stdout on pipes held by the test, stderr in a file.
class AgentProcess {
 public:
  explicit AgentProcess(const std::vector<std::string>& extra_args = {}) {
    ::signal(SIGPIPE, SIG_IGN);  // writing to an agent that has exited must not end the test
    std::vector<std::string> args = {binary("dtrain"), "agent"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::string err_path = dir_.path() + "/err";
    int in[2], out[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    in_.reset(in[1]);
    out_.reset(out[0]);
  }
  ~AgentProcess() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  int pid() const { return pid_; }
  void send(const std::string& text) {
    REQUIRE(::write(in_.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  }
  void close_stdin() { in_.reset(); }

  /// Reads stdout until done(out) holds or seconds pass (or stdout ends); returns done(out).
  bool read_until(const std::function<bool(const std::string&)>& done, double seconds) {
    double deadline = monotonic_seconds() + seconds;
    while (!done(out_text_) && out_.valid()) {
      int left = static_cast<int>((deadline - monotonic_seconds()) * 1000);
      if (left <= 0) break;
      pollfd p{out_.get(), POLLIN, 0};
      if (::poll(&p, 1, left) <= 0) continue;
      char chunk[65536];
      ssize_t n = ::read(out_.get(), chunk, sizeof chunk);
      if (n <= 0)
        out_.reset();
      else
        out_text_.append(chunk, static_cast<size_t>(n));
    }
    return done(out_text_);
  }
  bool read_until_contains(const std::string& text, double seconds) {
    return read_until([&](const std::string& out) { return out.find(text) != std::string::npos; },
                      seconds);
  }

  /// Reads stdout to its end and reaps the agent (SIGKILL after seconds). Exit code or 128+sig.
  int wait(double seconds) {
    double deadline = monotonic_seconds() + seconds;
    read_until([](const std::string&) { return false; }, seconds);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) != pid_) {
      if (monotonic_seconds() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  const std::string& out() const { return out_text_; }
  std::string err() const { return dtrain::common::read_file(dir_.path() + "/err"); }

 private:
  dtrain::testing::TempDir dir_;
  int pid_ = -1;
  bool reaped_ = false;
  UniqueFd in_, out_;
  std::string out_text_;
};

inline std::string request(std::vector<std::string> argv,
                           std::vector<std::pair<std::string, std::string>> env = {},
                           std::string cwd = "") {
  return dtrain::launcher::format_agent_request({std::move(argv), std::move(env), std::move(cwd)});
}

inline std::string test_worker_request(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {binary("dtrain-test-worker")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return request(argv, {{"TF_CONFIG", kTfConfig}});
}

// The lines of agent stdout of one kind: payloads for markers, whole lines for output.
inline std::vector<std::string> lines_of(const std::string& out, AgentLine::Kind kind) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    end = end == std::string::npos ? out.size() : end + 1;
    std::string text = out.substr(start, end - start);
    AgentLine line = dtrain::launcher::classify_agent_line(text);
    if (line.kind == kind) lines.emplace_back(line.payload);
    start = end;
  }
  return lines;
}

// Agent stdout as the launcher reads it (remote_child.cc): cut by a LineSplitter, lines that
// start a line classified, pieces after a cut taken as output. Output payloads are concatenated
// into output (the worker's bytes), marker payloads appended to markers.
inline void read_as_launcher(const std::vector<std::string>& reads, size_t max_line,
                             std::string& output, std::vector<std::string>& markers) {
  bool at_line_start = true;
  dtrain::launcher::LineSplitter splitter(
      [&](std::string_view line) {
        AgentLine parsed = at_line_start ? dtrain::launcher::classify_agent_line(line)
                                         : AgentLine{AgentLine::Kind::kOutput, line};
        at_line_start = !line.empty() && (line.back() == '\n' || line.back() == '\r');
        if (parsed.kind == AgentLine::Kind::kOutput)
          output.append(parsed.payload);
        else
          markers.emplace_back(parsed.payload);
      },
      max_line);
  for (const std::string& bytes : reads) splitter.feed(bytes);
  splitter.finish();
}

// The worker pid from the agent's "started" event (waits for it up to 5 s).
inline int worker_pid(AgentProcess& agent) {
  REQUIRE(agent.read_until_contains(std::string(kEventMarker) + "{\"event\":\"started\"", 5));
  REQUIRE(agent.read_until_contains("\n", 5));
  for (const std::string& payload : lines_of(agent.out(), AgentLine::Kind::kEvent)) {
    auto event = dtrain::launcher::parse_agent_event(payload);
    if (event && event->type == dtrain::launcher::AgentEvent::Type::kStarted) return event->pid;
  }
  FAIL("no started event in " << agent.out());
  return -1;
}

inline std::string cmdline(int pid) {
  std::string text = dtrain::common::read_file("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : text) c = c == '\0' ? ' ' : c;
  return text;
}

// Live (not zombie) processes whose process group is pgid.
inline std::vector<int> group_members(int pgid) {
  std::vector<int> members;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text;
    if (!std::getline(stat, text)) continue;
    size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    std::string state;
    int ppid = 0, group = 0;
    fields >> state >> ppid >> group;
    if (group == pgid && state != "Z") members.push_back(std::stoi(name));
  }
  return members;
}

// A guard against a hang, not a time limit: far above the seconds anything here takes.
inline constexpr double kGuardSeconds = 60;

// True once no live process is in group pgid; false if some remain after guard_seconds.
inline bool group_gone(int pgid, double guard_seconds = kGuardSeconds) {
  double start = monotonic_seconds();
  while (!group_members(pgid).empty()) {
    if (monotonic_seconds() - start > guard_seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// How many members of group pgid run a command line that starts with command ("sleep 100").
inline size_t group_members_running(int pgid, const std::string& command) {
  size_t n = 0;
  for (int pid : group_members(pgid)) n += cmdline(pid).rfind(command, 0) == 0;
  return n;
}

// The agent's events in out's whole lines, in order.
inline std::vector<launcher::AgentEvent> events_of(const std::string& out) {
  std::vector<launcher::AgentEvent> events;
  const std::string whole = out.substr(0, out.rfind('\n') + 1);  // npos + 1: none
  for (const std::string& payload : lines_of(whole, AgentLine::Kind::kEvent)) {
    auto event = launcher::parse_agent_event(payload);
    REQUIRE(event);
    events.push_back(*event);
  }
  return events;
}

// Events of type after the first one of type after; 0 while there is none.
inline size_t count_after(const std::vector<launcher::AgentEvent>& events,
                          launcher::AgentEvent::Type type, launcher::AgentEvent::Type after) {
  size_t n = 0;
  bool seen = false;
  for (const launcher::AgentEvent& event : events) {
    if (seen) n += event.type == type;
    seen = seen || event.type == after;
  }
  return n;
}

// True when every marker byte in out starts a line and every marker line ends with '\n'.
inline bool markers_only_at_line_starts(const std::string& out) {
  for (size_t at = out.find('\x1e'); at != std::string::npos; at = out.find('\x1e', at + 1)) {
    if (at > 0 && out[at - 1] != '\n') return false;
    if (out.find('\n', at) == std::string::npos) return false;
  }
  return true;
}

}  // namespace dtrain::testing::agent
