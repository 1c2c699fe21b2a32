// `dtrain agent` with real processes (the built dtrain, test_worker and sh as workers) over pipes:
// the request reaches the worker and never argv, output comes in whole lines with control and
// event lines between them, signal commands reach the group, a closed session or a killed agent
// leaves no process behind, and a bad first line is exit 2. Also the framing and protocol
// functions on their own.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/atomic_file.h"
#include "common/control_protocol.h"
#include "launcher/placement/agent_output.h"
#include "launcher/placement/agent_protocol.h"
#include "test/launcher/agent_process.h"
#include "test/support/processes.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using dtrain::launcher::AgentEvent;
using dtrain::launcher::AgentLine;
using dtrain::launcher::AgentOutput;
using dtrain::launcher::AgentRequest;
using dtrain::launcher::kControlMarker;
using dtrain::launcher::kEventMarker;
using dtrain::testing::process_alive;
using dtrain::testing::agent::AgentProcess;
using dtrain::testing::agent::cmdline;
using dtrain::testing::agent::count_after;
using dtrain::testing::agent::events_of;
using dtrain::testing::agent::group_gone;
using dtrain::testing::agent::group_members;
using dtrain::testing::agent::group_members_running;
using dtrain::testing::agent::kGuardSeconds;
using dtrain::testing::agent::lines_of;
using dtrain::testing::agent::markers_only_at_line_starts;
using dtrain::testing::agent::read_as_launcher;
using dtrain::testing::agent::request;
using dtrain::testing::agent::test_worker_request;
using dtrain::testing::agent::worker_pid;
namespace fs = std::filesystem;

TEST_CASE("agent: argv, env and cwd from the first line reach the worker, never a command line",
          "[agent]") {
  dtrain::testing::TempDir cwd;
  std::string token = "tok" + std::to_string(::getpid()) + "e7c1d2b3a4f5";
  AgentProcess agent;
  agent.send(request({"sh", "-c",
                      "echo cwd=$(pwd -P); echo token=$DTRAIN_TOKEN; echo arg=$1; "
                      "echo control=$DTRAIN_CONTROL; sleep 0.5; exit 7",
                      "sh", "two words"},
                     {{"DTRAIN_TOKEN", token}, {"DTRAIN_CONTROL", "unix:/elsewhere"}}, cwd.path()));
  int worker = worker_pid(agent);
  REQUIRE(agent.read_until_contains("control=", 5));
  REQUIRE(agent.read_until_contains(".sock\n", 5));
  CHECK(cmdline(agent.pid()).find(token) == std::string::npos);
  CHECK(cmdline(worker).find(token) == std::string::npos);
  CHECK(cmdline(worker).find("two words") != std::string::npos);
  std::string out = agent.out();
  size_t at = out.find("control=unix:") + std::string("control=unix:").size();
  fs::path socket = out.substr(at, out.find('\n', at) - at);
  struct stat folder {};
  REQUIRE(::stat(socket.parent_path().c_str(), &folder) == 0);
  CHECK((folder.st_mode & 0777) == 0700);
  CHECK(fs::is_socket(socket));

  CHECK(agent.wait(10) == 7);
  std::vector<std::string> lines = lines_of(agent.out(), AgentLine::Kind::kOutput);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "cwd=" + fs::canonical(cwd.path()).string() + "\n");
  CHECK(lines[1] == "token=" + token + "\n");
  CHECK(lines[2] == "arg=two words\n");
  CHECK(lines_of(agent.out(), AgentLine::Kind::kEvent).back() == R"({"event":"exit","code":7})");
  CHECK_FALSE(fs::exists(socket.parent_path()));
}

TEST_CASE("agent: output goes out in whole lines, in order, and a partial last line at the end",
          "[agent]") {
  SECTION("a line written in two pieces is held until its end") {
    AgentProcess agent;
    agent.send(
        request({"sh", "-c",
                 "printf 'first\\n'; printf 'abc'; sleep 0.4; printf 'def\\r\\n'; printf tail"}));
    REQUIRE(agent.read_until_contains("first\n", 5));
    agent.read_until([](const std::string&) { return false; }, 0.2);
    CHECK(agent.out().find("abc") == std::string::npos);
    CHECK(agent.wait(10) == 0);
    std::vector<std::string> lines = lines_of(agent.out(), AgentLine::Kind::kOutput);
    CHECK(lines == std::vector<std::string>{"first\n", "abcdef\r\n", "tail"});
    CHECK(agent.out().substr(agent.out().size() - 5) == "\ntail");  // the very last bytes
  }
  SECTION("many lines with heartbeats between them") {
    const long kLines = 5000;
    AgentProcess agent;
    agent.send(test_worker_request(
        {"--lines", std::to_string(kLines), "--heartbeat", "--sleep", "0.3", "--partial"}));
    CHECK(agent.wait(10) == 0);
    const std::string& out = agent.out();
    CHECK(markers_only_at_line_starts(out));
    std::vector<std::string> lines = lines_of(out, AgentLine::Kind::kOutput);
    REQUIRE(lines.size() == static_cast<size_t>(kLines) + 2);
    CHECK(lines[0].rfind("test_worker task=worker:0 attempt=0", 0) == 0);
    for (long i = 0; i < kLines; ++i) {
      std::string expected = "worker:0 line " + std::to_string(i) + " of " + std::to_string(kLines);
      if (lines[static_cast<size_t>(i) + 1].rfind(expected + " ", 0) != 0) {
        FAIL("line " << i << " is " << lines[static_cast<size_t>(i) + 1]);
      }
    }
    CHECK(lines.back() == "no newline at the end");
    CHECK(out.substr(out.size() - lines.back().size() - 1) == "\nno newline at the end");
  }
}

TEST_CASE("agent: a heartbeat on DTRAIN_CONTROL comes out as a control line", "[agent]") {
  AgentProcess agent;
  agent.send(test_worker_request({"--heartbeat", "--sleep", "0.4"}));
  CHECK(agent.wait(10) == 0);
  std::vector<std::string> controls = lines_of(agent.out(), AgentLine::Kind::kControl);
  REQUIRE_FALSE(controls.empty());
  auto message = dtrain::common::parse_control_message(controls.front());
  REQUIRE(message);
  CHECK(message->type == dtrain::common::ControlMessageType::kHeartbeat);
  CHECK(message->task == "worker:0");
  CHECK(markers_only_at_line_starts(agent.out()));
}

TEST_CASE("agent: a signal command reaches the group; the exit code is the worker's", "[agent]") {
  SECTION("a worker that handles SIGTERM") {
    AgentProcess agent;
    agent.send(request(
        {"sh", "-c", "trap 'exit 42' TERM; sleep 100 & echo ready; while :; do sleep 0.05; done"}));
    int worker = worker_pid(agent);
    REQUIRE(agent.read_until_contains("ready\n", 5));
    // sh does not wait for its background job to exec; a signal before that is lost to sh's trap
    REQUIRE(dtrain::testing::wait_for(
        [&] { return group_members_running(worker, "sleep 100") == 1; }, kGuardSeconds));
    agent.send(dtrain::launcher::format_agent_signal_command(SIGTERM));
    CHECK(agent.wait(kGuardSeconds) == 42);
    CHECK(group_gone(worker));  // the background sleep got it too
  }
  SECTION("a worker killed by SIGTERM: 143") {
    AgentProcess agent;
    agent.send(test_worker_request({"--hang"}));
    REQUIRE(agent.read_until_contains("test_worker task=", 5));
    agent.send("{\"signal\": 15}\n");
    CHECK(agent.wait(5) == 143);
    CHECK(lines_of(agent.out(), AgentLine::Kind::kEvent).back() ==
          R"({"event":"exit","signal":15})");
  }
  SECTION("a worker that ignores SIGTERM, then SIGKILL: 137") {
    AgentProcess agent;
    agent.send(test_worker_request({"--hang", "--ignore-sigterm", "--lines", "1"}));
    int worker = worker_pid(agent);
    REQUIRE(agent.read_until_contains("line 0 of 1", 5));  // printed after SIGTERM is ignored
    agent.send("{\"signal\": 15}\nnot a command\n");
    // The agent warns of the second line after it has sent the first one's SIGTERM, which the
    // kernel drops at once for a process that ignores it.
    REQUIRE(dtrain::testing::wait_for(
        [&] { return agent.err().find("ignored a command") != std::string::npos; }, kGuardSeconds));
    CHECK(process_alive(worker));
    agent.send("{\"signal\": 9}\n");
    CHECK(agent.wait(kGuardSeconds) == 137);  // SIGKILL ended it, not the SIGTERM before
    CHECK(lines_of(agent.out(), AgentLine::Kind::kEvent).back() ==
          R"({"event":"exit","signal":9})");
  }
}

TEST_CASE("agent: the end of stdin ends the whole process group", "[agent]") {
  SECTION("a worker and a grandchild that ignore SIGTERM") {
    AgentProcess agent;
    agent.send(test_worker_request({"--grandchild", "--hang", "--ignore-sigterm"}));
    int worker = worker_pid(agent);
    REQUIRE(agent.read_until_contains("grandchild pid=", 5));
    REQUIRE(group_members(worker).size() == 2);
    agent.close_stdin();
    CHECK(group_gone(worker));
    CHECK(agent.wait(kGuardSeconds) == 137);  // SIGTERM was ignored: SIGKILL did it
    std::vector<AgentEvent> events = events_of(agent.out());
    REQUIRE_FALSE(events.empty());
    CHECK(events.back().type == AgentEvent::Type::kExit);
    CHECK(events.back().status.signal == SIGKILL);
  }
  SECTION("a shell with a background job") {
    AgentProcess agent;
    agent.send(request({"sh", "-c", "sleep 100 & echo started; sleep 100"}));
    int worker = worker_pid(agent);
    REQUIRE(agent.read_until_contains("started\n", 5));
    REQUIRE(dtrain::testing::wait_for(  // both sleeps exec'd: sh and two sleeps in the group
        [&] { return group_members_running(worker, "sleep 100") == 2; }, kGuardSeconds));
    REQUIRE(group_members(worker).size() == 3);
    agent.close_stdin();
    CHECK(group_gone(worker));
    CHECK(agent.wait(kGuardSeconds) == 143);  // SIGTERM was enough
  }
}

TEST_CASE(
    "agent: a signal to the agent reaches the group, is reported, and SIGKILL waits "
    "--signal-grace",
    "[agent]") {
  SECTION("a worker that saves for 1 s on SIGTERM, then exits 143, within a 5 s grace") {
    AgentProcess agent({"--signal-grace", "5"});
    agent.send(request({"sh", "-c",
                        "trap 'sleep 1; echo saved; exit 143' TERM; echo ready; "
                        "while :; do sleep 0.05; done"}));
    worker_pid(agent);
    REQUIRE(agent.read_until_contains("ready\n", 5));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(agent.pid(), SIGTERM);  // as slurmstepd or a host's shutdown would
    CHECK(agent.wait(10) == 143);
    CHECK(agent.out().find("saved\n") != std::string::npos);
    std::vector<std::string> events = lines_of(agent.out(), AgentLine::Kind::kEvent);
    events.erase(std::remove_if(events.begin(), events.end(),
                                [](const std::string& event) {
                                  return event.rfind(R"({"event":"watch",)", 0) == 0;
                                }),
                 events.end());  // twice a second meanwhile
    REQUIRE(events.size() == 3);
    CHECK(events[1] == R"({"event":"signaled","signal":15})");
    CHECK(events[2] == R"({"event":"exit","code":143})");
    auto parsed = dtrain::launcher::parse_agent_event(events[1]);
    REQUIRE(parsed);
    CHECK(parsed->type == dtrain::launcher::AgentEvent::Type::kSignaled);
    CHECK(parsed->signal == SIGTERM);
  }
  SECTION("a worker that ignores it is SIGKILLed after the grace; the end of stdin cuts it short") {
    // A grace of an hour, far beyond the guard: the group can end within the guard only because
    // the end of stdin brought the SIGKILL forward.
    AgentProcess agent({"--signal-grace", "3600"});
    agent.send(test_worker_request({"--hang", "--ignore-sigterm", "--lines", "1"}));
    int worker = worker_pid(agent);
    REQUIRE(agent.read_until_contains("line 0 of 1", 5));
    ::kill(agent.pid(), SIGTERM);
    // Two watch events after the signaled one: the agent's loop checked its deadlines at least
    // once after it passed SIGTERM on, and the worker was still running at the second.
    auto two_watches = [](const std::string& out) {
      return count_after(events_of(out), AgentEvent::Type::kWatch, AgentEvent::Type::kSignaled) >=
             2;
    };
    REQUIRE(agent.read_until(two_watches, kGuardSeconds));
    CHECK(process_alive(worker));  // still within the grace
    for (const AgentEvent& event : events_of(agent.out()))
      CHECK(event.type != AgentEvent::Type::kExit);
    agent.close_stdin();  // the session closed: SIGKILL kill_after_seconds later after all
    CHECK(group_gone(worker));
    CHECK(agent.wait(kGuardSeconds) == 137);
    std::vector<AgentEvent> events = events_of(agent.out());
    REQUIRE_FALSE(events.empty());
    CHECK(events.back().type == AgentEvent::Type::kExit);
    CHECK(events.back().status.signal == SIGKILL);
  }
}

TEST_CASE("agent: SIGKILL of the agent kills the worker (parent-death signal)", "[agent]") {
  AgentProcess agent;
  agent.send(test_worker_request({"--hang"}));
  int worker = worker_pid(agent);
  REQUIRE(process_alive(worker));
  // A SIGKILLed agent cannot remove its folder: the test does, found in the worker's environment.
  std::string environ = dtrain::common::read_file("/proc/" + std::to_string(worker) + "/environ");
  size_t at = environ.find("DTRAIN_CONTROL=unix:");
  REQUIRE(at != std::string::npos);
  at += std::string("DTRAIN_CONTROL=unix:").size();
  fs::path folder = fs::path(environ.substr(at, environ.find('\0', at) - at)).parent_path();
  REQUIRE(folder.filename().string().rfind("dtrain-agent-", 0) == 0);
  ::kill(agent.pid(), SIGKILL);
  CHECK(agent.wait(kGuardSeconds) == 128 + SIGKILL);
  CHECK(dtrain::testing::wait_for([&] { return !process_alive(worker); }, kGuardSeconds));
  fs::remove_all(folder);
}

TEST_CASE("agent: a bad or missing first line is exit 2 with a message", "[agent]") {
  struct Case {
    std::string input;
    std::string message;
  };
  std::string missing_dir = "/nonexistent-dtrain-dir";
  auto c = GENERATE_COPY(
      Case{"not json\n", "agent request: line 1"}, Case{"[\"sh\"]\n", "expected an object"},
      Case{"{\"argv\": []}\n", "argv: expected a non-empty list"},
      Case{"{\"argv\": [\"sh\"], \"env\": [[\"A\"]]}\n", "env[0]: expected [name, value]"},
      Case{"{\"argv\": [\"sh\"], \"bogus\": 1}\n", "unknown key \"bogus\""},
      Case{"{\"argv\": [\"/nonexistent/program\"]}\n",
           "program \"/nonexistent/program\" does not exist"},
      Case{"{\"argv\": [\"sh\"], \"cwd\": \"" + missing_dir + "\"}\n", "working folder"},
      Case{"{\"argv\": [\"sh\"]}", "stdin closed before a whole request line"},
      Case{"", "stdin closed before a whole request line"});
  AgentProcess agent;
  if (!c.input.empty()) agent.send(c.input);
  agent.close_stdin();
  CHECK(agent.wait(5) == 2);
  INFO("stderr: " << agent.err());
  CHECK(agent.err().find(c.message) != std::string::npos);
  CHECK(agent.out().empty());
}

TEST_CASE("agent: no first line within the time-out is exit 2", "[agent]") {
  AgentProcess agent({"--request-timeout", "0.3"});
  CHECK(agent.wait(kGuardSeconds) == 2);  // its own time-out ended it, not the guard's SIGKILL
  CHECK(agent.err().find("no request on stdin within 0.3 s") != std::string::npos);
}

TEST_CASE("agent output: markers only between whole lines", "[agent]") {
  const std::string m(kControlMarker);
  AgentOutput output(16);
  output.feed("ab");
  output.add_marked(kControlMarker, "{}");
  CHECK(output.ready() == m + "{}\n");  // the partial line is not out yet
  output.ready().clear();
  output.feed("c\nd");
  CHECK(output.ready() == "abc\n");
  output.ready().clear();

  // '\r' ends a line unless "\n" follows; a trailing '\r' waits for the next byte.
  output.feed("\r1/3\r2/3\r");
  CHECK(output.ready() == "d\r1/3\r");
  output.feed("\n");
  CHECK(output.ready() == "d\r1/3\r2/3\r\n");
  output.ready().clear();

  // An overlong line goes out in pieces; markers wait for its end.
  output.feed("0123456789abcdefXY");
  CHECK(output.ready() == "0123456789abcdefXY");
  output.add_marked(kEventMarker, "{\"event\":\"exit\",\"code\":0}");
  CHECK(output.ready() == "0123456789abcdefXY");
  output.feed("Z\n");
  CHECK(output.ready() ==
        "0123456789abcdefXYZ\n" + std::string(kEventMarker) + "{\"event\":\"exit\",\"code\":0}\n");
  output.ready().clear();

  // The end: a partial last line is the last thing; nothing is glued to it.
  output.feed("last");
  output.finish();
  output.add_marked(kControlMarker, "{}");
  CHECK(output.ready() == "last");
  CHECK(output.dropped() == 1);
}

TEST_CASE("agent protocol: requests, commands and lines round-trip", "[agent]") {
  AgentRequest in{{"prog", "a b", "\"q\""}, {{"K", "v=1"}, {"DTRAIN_TOKEN", "t"}}, "/w"};
  std::string line = dtrain::launcher::format_agent_request(in);
  REQUIRE(line.back() == '\n');
  REQUIRE(line.find('\n') == line.size() - 1);
  AgentRequest out = dtrain::launcher::parse_agent_request(line.substr(0, line.size() - 1));
  CHECK(out.argv == in.argv);
  CHECK(out.env == in.env);
  CHECK(out.cwd == in.cwd);
  using dtrain::launcher::AgentCommand;
  using dtrain::launcher::parse_agent_command;
  CHECK(parse_agent_command("{\"signal\": 9}").signal == 9);
  CHECK(parse_agent_command("{\"signal\": 0}").signal == 0);  // keep-alive
  CHECK(parse_agent_command("{\"signal\": 0}").kind == AgentCommand::Kind::kSignal);
  CHECK_THROWS(parse_agent_command("{\"signal\": -1}"));
  CHECK_THROWS(parse_agent_command("{\"kill\": 9}"));
  AgentCommand queued = parse_agent_command("{\"signal\": 10, \"value\": 3}");
  CHECK(queued.kind == AgentCommand::Kind::kQueueSignal);
  CHECK((queued.signal == 10 && queued.value == 3));
  CHECK_THROWS(parse_agent_command("{\"signal\": 0, \"value\": 3}"));  // nothing to queue
  std::string reply_line = dtrain::launcher::format_agent_reply_command(7, "{\"ok\": true}\n");
  REQUIRE(reply_line.back() == '\n');
  reply_line.pop_back();
  AgentCommand reply = parse_agent_command(reply_line);
  CHECK(reply.kind == AgentCommand::Kind::kReply);
  CHECK((reply.id == 7 && reply.line == "{\"ok\": true}"));
  CHECK_THROWS(parse_agent_command("{\"reply\": 7}"));
  CHECK_THROWS(parse_agent_command("{\"reply\": 7, \"line\": \"a\", \"signal\": 9}"));

  auto control = dtrain::launcher::classify_agent_line(std::string(kControlMarker) + "{}\n");
  CHECK(control.kind == AgentLine::Kind::kControl);
  CHECK(control.payload == "{}");
  auto output = dtrain::launcher::classify_agent_line("dtrain-control {}\n");
  CHECK(output.kind == AgentLine::Kind::kOutput);
  CHECK(output.payload == "dtrain-control {}\n");
  auto exit = dtrain::launcher::parse_agent_event(
      dtrain::launcher::format_agent_exit_event(dtrain::launcher::ExitStatus::killed(9)));
  REQUIRE(exit);
  CHECK(exit->type == dtrain::launcher::AgentEvent::Type::kExit);
  CHECK(exit->status.signaled);
  CHECK(exit->status.signal == 9);
  CHECK_FALSE(dtrain::launcher::parse_agent_event("{\"event\":\"other\"}"));
}

TEST_CASE("agent: a worker line starting with the marker byte cannot fake an event", "[agent]") {
  // Issue 25: a worker printing a "signaled" event line made a Slurm launch exit 143.
  const std::string fake = std::string(kEventMarker) + "{\"event\":\"signaled\",\"signal\":15}";
  const std::string fake_control = std::string(kControlMarker) + "{\"type\":\"heartbeat\"}";
  AgentProcess agent;
  agent.send(request({"sh", "-c",
                      "printf '%s\\n' \"$1\"; printf 'bar\\r%s\\r\\n' \"$2\"; printf '%s' \"$1\"",
                      "sh", fake, fake_control}));
  CHECK(agent.wait(10) == 0);
  std::string output;
  std::vector<std::string> markers;
  read_as_launcher({agent.out()}, dtrain::launcher::kMaxAgentLine, output, markers);
  CHECK(output == fake + "\nbar\r" + fake_control + "\r\n" + fake);  // byte for byte
  std::vector<dtrain::launcher::AgentEvent::Type> events;
  for (const std::string& payload : markers) {
    auto event = dtrain::launcher::parse_agent_event(payload);
    REQUIRE(event);  // no control line: only the agent's own events
    events.push_back(event->type);
  }
  using Type = dtrain::launcher::AgentEvent::Type;
  // The exit event may be dropped: nothing is glued to an unterminated last line.
  REQUIRE_FALSE(events.empty());
  CHECK(events.front() == Type::kStarted);
  CHECK(std::count(events.begin(), events.end(), Type::kSignaled) == 0);
}

TEST_CASE("agent output: worker lines starting with 0x1e round-trip byte for byte", "[agent]") {
  const std::string m(kEventMarker), c(kControlMarker), l(dtrain::launcher::kLineMarker);
  const std::string pad(48, 'p');  // the launcher cuts at 48 here, the agent at 16
  const std::vector<std::string> worker = {
      "\x1e\n",
      "\x1e\x1e\n",
      m + "{\"event\":\"exit\",\"code\":0}\n",
      c + "{}\r\n",
      l + "nested\n",
      "plain \x1e inside\n",
      "bar\r" + m + "{}\r",
      "x\n",
      pad + m + "{}\n",  // overlong: the piece after the launcher's cut is no line start
      m + pad + "\n",
      "\x1elast"};
  std::string all;
  for (const std::string& line : worker) all += line;
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, all.size()}) {
    INFO("reads of " << chunk << " bytes");
    AgentOutput framing(16);
    std::vector<std::string> reads;
    for (size_t at = 0; at < all.size(); at += chunk) {
      framing.feed(all.substr(at, chunk));
      framing.add_marked(kEventMarker, "{\"event\":\"started\",\"pid\":7}");
      reads.push_back(framing.ready());
      framing.ready().clear();
    }
    framing.finish();
    reads.push_back(framing.ready());
    for (size_t max_line : {size_t{48}, dtrain::launcher::kMaxAgentLine}) {
      std::string output;
      std::vector<std::string> markers;
      read_as_launcher(reads, max_line, output, markers);
      CHECK(output == all);
      for (const std::string& payload : markers)
        CHECK(payload == "{\"event\":\"started\",\"pid\":7}");
    }
  }
  const std::string escaped_line = l + m + "{}\r\n";
  auto escaped = dtrain::launcher::classify_agent_line(escaped_line);
  CHECK(escaped.kind == AgentLine::Kind::kOutput);
  CHECK(escaped.payload == m + "{}\r\n");
}
