// What `dtrain agent` adds for recovery in place over ssh and Slurm, with real processes
// (dtrain-test-worker as the worker): a worker's reform request relayed to the launcher and the
// reply relayed back, a queued signal with its value to the worker alone, and watch events (the
// worker's /proc state and progress record) twice a second. Also the control socket on its own.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/control_protocol.h"
#include "common/unique_fd.h"
#include "launcher/placement/agent_control.h"
#include "launcher/placement/agent_protocol.h"
#include "test/launcher/agent_process.h"
#include "test/support/subprocess.h"

using dtrain::common::monotonic_seconds;
using dtrain::common::UniqueFd;
using dtrain::launcher::AgentControlSocket;
using dtrain::launcher::AgentEvent;
using dtrain::launcher::AgentLine;
using dtrain::launcher::RelayedRequest;
using dtrain::testing::agent::AgentProcess;
using dtrain::testing::agent::group_members;
using dtrain::testing::agent::kTfConfig;
using dtrain::testing::agent::lines_of;
using dtrain::testing::agent::markers_only_at_line_starts;
using dtrain::testing::agent::request;
using dtrain::testing::agent::test_worker_request;
using dtrain::testing::agent::worker_pid;
namespace fs = std::filesystem;

namespace {

// The relayed requests in out, from whole lines only.
std::vector<RelayedRequest> relayed_requests(const std::string& out) {
  std::vector<RelayedRequest> requests;
  for (size_t start = 0, end; (end = out.find('\n', start)) != std::string::npos; start = end + 1) {
    AgentLine line = dtrain::launcher::classify_agent_line(out.substr(start, end + 1 - start));
    if (line.kind != AgentLine::Kind::kRequest) continue;
    auto relayed = dtrain::launcher::parse_relayed_request(line.payload);
    REQUIRE(relayed);
    requests.push_back(*relayed);
  }
  return requests;
}

// The events in out, in order, each parsed.
std::vector<AgentEvent> events_of(const std::string& out) {
  std::vector<AgentEvent> events;
  for (const std::string& payload : lines_of(out, AgentLine::Kind::kEvent)) {
    auto event = dtrain::launcher::parse_agent_event(payload);
    REQUIRE(event);
    events.push_back(*event);
  }
  return events;
}

// The text after prefix on the last of the worker's output lines that start with it ("" when
// none).
std::string output_value(const std::string& out, const std::string& prefix) {
  std::string value;
  for (const std::string& line : lines_of(out, AgentLine::Kind::kOutput)) {
    if (line.rfind(prefix, 0) == 0 && line.back() == '\n')
      value = line.substr(prefix.size(), line.size() - prefix.size() - 1);
  }
  return value;
}

// A client connected to the socket at address ("unix:<path>").
UniqueFd connect_to(const std::string& address) {
  std::string path = address.substr(std::strlen(dtrain::common::kControlScheme));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

void send_text(int fd, const std::string& text) {
  REQUIRE(::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size()));
}

// Runs the socket's side as the agent's loop does until done() holds or seconds pass.
bool pump(AgentControlSocket& socket, const AgentControlSocket::Handlers& handlers,
          const std::function<bool()>& done, double seconds) {
  double deadline = monotonic_seconds() + seconds;
  while (!done() && monotonic_seconds() < deadline) {
    std::vector<pollfd> fds;
    size_t count = socket.add_poll_fds(fds);
    if (::poll(fds.data(), fds.size(), 20) > 0) socket.handle(fds.data(), count, handlers);
  }
  return done();
}

// What a client reads within seconds: up to and including the first newline, or all it got
// before the end ("" when the connection ended with nothing).
std::string read_reply(int fd, double seconds) {
  std::string text;
  double deadline = monotonic_seconds() + seconds;
  while (text.find('\n') == std::string::npos && monotonic_seconds() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    char chunk[4096];
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) break;
    text.append(chunk, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

TEST_CASE("agent: a worker's reform request goes to the launcher and its reply back", "[agent]") {
  AgentProcess agent;
  // The first request gives up after 1 s (its connection closes when the second one starts);
  // the second waits up to 20 s for the reply.
  agent.send(test_worker_request({"--request-reform", "1", "--request-reform", "20"}));
  REQUIRE(
      agent.read_until([](const std::string& out) { return !relayed_requests(out).empty(); }, 10));
  RelayedRequest first = relayed_requests(agent.out()).front();
  CHECK(first.json.find('\n') == std::string::npos);
  auto reform = dtrain::common::parse_reform_request(first.json);
  REQUIRE(reform);
  CHECK(reform->task == "worker:0");
  CHECK(reform->whole_step == 3);
  CHECK(reform->in_flight);
  CHECK(reform->what == "test_worker: asked to");

  REQUIRE(agent.read_until_contains("reform reply: none\n", 10));
  REQUIRE(agent.read_until([](const std::string& out) { return relayed_requests(out).size() >= 2; },
                           10));
  RelayedRequest second = relayed_requests(agent.out())[1];
  CHECK(second.id != first.id);
  REQUIRE(dtrain::common::parse_reform_request(second.json));

  // Late, unknown and real replies: only the real one reaches the worker, on its connection.
  using dtrain::launcher::format_agent_reply_command;
  agent.send(
      format_agent_reply_command(first.id, dtrain::common::format_reform_reply({true, 99, ""})));
  agent.send(format_agent_reply_command(second.id + 1000, "{\"request\":\"reform\",\"ok\":false}"));
  std::string reply = dtrain::common::format_reform_reply({true, 5, ""});
  agent.send(format_agent_reply_command(second.id, reply));
  REQUIRE(agent.read_until_contains("reform reply: {", 10));
  CHECK(agent.wait(10) == 0);
  CHECK(output_value(agent.out(), "reform reply: ") + "\n" == reply);
  CHECK(agent.out().find("\"generation\":99") == std::string::npos);
  CHECK(relayed_requests(agent.out()).size() == 2);
  CHECK(markers_only_at_line_starts(agent.out()));
  CHECK(agent.err().empty());
}

TEST_CASE("agent: a queued signal reaches the worker alone, with its value", "[agent]") {
  AgentProcess agent;
  // The grandchild keeps SIGUSR1's default action: the signal to the group would end it.
  agent.send(test_worker_request({"--grandchild", "--print-sigusr1"}));
  int worker = worker_pid(agent);
  REQUIRE(agent.read_until_contains("sigusr1 ready\n", 10));
  int grandchild = std::stoi(output_value(agent.out(), "grandchild pid="));
  std::vector<int> members = group_members(worker);
  REQUIRE(std::count(members.begin(), members.end(), grandchild) == 1);

  agent.send(dtrain::launcher::format_agent_queue_command(SIGUSR1, 5));
  REQUIRE(agent.read_until_contains("sigusr1 value=", 10));
  REQUIRE(agent.read_until_contains("{\"event\":\"exit\"", 10));
  CHECK(output_value(agent.out(), "sigusr1 value=") == "5 queued=yes");
  members = group_members(worker);  // the worker has exited; its grandchild lives on
  CHECK(std::count(members.begin(), members.end(), grandchild) == 1);
  agent.close_stdin();  // ends the grandchild, which holds the output open
  CHECK(agent.wait(5) == 0);
}

TEST_CASE("agent: watch events come twice a second until the worker ends", "[agent]") {
  SECTION("with the progress record the worker keeps where the agent says") {
    const std::string given = "/nonexistent-launcher-host/run/progress/worker-0";
    double start = monotonic_seconds();
    AgentProcess agent;
    // The worker writes its record 0.7 s after it starts, steps it 10 times in 1 s, and lingers.
    agent.send(request(
        {dtrain::testing::binary("dtrain-test-worker"), "--write-progress", "10", "--sleep", "0.7"},
        {{"TF_CONFIG", kTfConfig}, {"DTRAIN_PROGRESS_FILE", given}}));
    int worker = worker_pid(agent);
    CHECK(agent.wait(15) == 0);
    double lived = monotonic_seconds() - start;  // at least the worker's 2.4 s

    fs::path path = output_value(agent.out(), "progress file=");
    CHECK(path != given);
    CHECK(path.filename() == "progress");
    CHECK(path.parent_path().filename().string().rfind("dtrain-agent-", 0) == 0);
    CHECK_FALSE(fs::exists(path.parent_path()));  // removed with the agent's folder
    CHECK(output_value(agent.out(), "progress steps=") == "10");

    std::vector<AgentEvent> events = events_of(agent.out());
    REQUIRE(events.size() >= 2);
    CHECK(events.front().type == AgentEvent::Type::kStarted);
    CHECK(events.back().type == AgentEvent::Type::kExit);  // no watch event after it
    std::vector<AgentEvent> watches;
    for (const AgentEvent& event : events)
      if (event.type == AgentEvent::Type::kWatch) watches.push_back(event);
    INFO(agent.out());
    CHECK(watches.size() >= 3);
    CHECK(static_cast<double>(watches.size()) <= lived / 0.5 + 2);
    bool recorded = false;
    uint64_t ticks = 0, step = 0;
    for (const AgentEvent& watch : watches) {
      CHECK(std::isalpha(static_cast<unsigned char>(watch.process.state)));
      CHECK(watch.process.cpu_ticks >= ticks);
      ticks = watch.process.cpu_ticks;
      CHECK((watch.record.has_value() || !recorded));  // once written, always there
      if (!watch.record) continue;
      recorded = true;
      CHECK(watch.record->pid == worker);
      CHECK(watch.record->generation == 2);
      CHECK(watch.record->global_step >= step);
      CHECK(watch.record->global_step <= 10);
      CHECK(watch.record->ended == watch.record->global_step);
      step = watch.record->global_step;
    }
    CHECK(recorded);
    CHECK(step >= 1);
    CHECK(markers_only_at_line_starts(agent.out()));
    std::vector<std::string> output = lines_of(agent.out(), AgentLine::Kind::kOutput);
    REQUIRE(output.size() == 3);  // the worker's own lines only
    CHECK(output[2] == "progress steps=10\n");
  }
  SECTION("without DTRAIN_PROGRESS_FILE: no record, and a chatty worker does not hold them up") {
    AgentProcess agent;
    // Output without a pause: poll() never times out, and tens of MB go by.
    agent.send(test_worker_request({"--flood", "--sleep", "1.5"}));
    CHECK(agent.wait(20) == 0);
    std::vector<AgentEvent> events = events_of(agent.out());
    size_t watches = 0;
    for (const AgentEvent& event : events) {
      if (event.type != AgentEvent::Type::kWatch) continue;
      ++watches;
      CHECK_FALSE(event.record);
    }
    CHECK(watches >= 2);  // 3 expected in 1.5 s
    REQUIRE_FALSE(events.empty());
    CHECK(events.back().type == AgentEvent::Type::kExit);
    CHECK(markers_only_at_line_starts(agent.out()));
  }
}

TEST_CASE("agent control socket: requests wait for their reply, within bounds", "[agent]") {
  AgentControlSocket socket;
  std::vector<std::string> messages;
  std::vector<std::pair<uint64_t, std::string>> requests;
  AgentControlSocket::Handlers handlers;
  handlers.message = [&](std::string_view json) { messages.emplace_back(json); };
  handlers.request = [&](uint64_t id, std::string_view json) { requests.emplace_back(id, json); };

  UniqueFd a = connect_to(socket.address());
  send_text(a.get(), dtrain::common::format_control_message(
                         dtrain::common::heartbeat_message("worker:0", 0, 7)) +
                         "{\"request\": \"status\"}\n{\"request\": 5}\n[1]\n"
                         "{ \"request\" : \"reform\", \"task\" : \"worker:0\" }\n");
  REQUIRE(pump(
      socket, handlers, [&] { return !messages.empty() && !requests.empty(); }, 5));
  UniqueFd b = connect_to(socket.address());
  send_text(b.get(), "{\"request\":\"spare\",\"spare\":\"spare:0\",\"pid\":4}\n");
  REQUIRE(pump(
      socket, handlers, [&] { return requests.size() == 2; }, 5));
  CHECK(messages.size() == 1);  // the status request and the malformed lines are dropped
  CHECK(requests[0].second == R"({"request":"reform","task":"worker:0"})");
  CHECK(requests[1].second == R"({"request":"spare","spare":"spare:0","pid":4})");
  CHECK(requests[0].first != requests[1].first);
  CHECK(socket.open_requests() == 2);

  const std::string answer = R"({"request":"reform","ok":true,"generation":1})";
  CHECK(socket.reply(requests[0].first, answer));
  CHECK(read_reply(a.get(), 5) == answer + "\n");
  CHECK_FALSE(socket.reply(requests[0].first, answer));  // answered once only
  CHECK_FALSE(socket.reply(12345, answer));
  CHECK(socket.open_requests() == 1);
  b.reset();  // gone before its reply: the id is forgotten
  REQUIRE(pump(
      socket, handlers, [&] { return socket.open_requests() == 0; }, 5));
  CHECK_FALSE(socket.reply(requests[1].first, answer));

  // One request beyond the bound closes its connection, forgetting its others.
  UniqueFd c = connect_to(socket.address());
  std::string many;
  for (size_t i = 0; i <= AgentControlSocket::kMaxOpenRequests; ++i)
    many += "{\"request\":\"spare\",\"spare\":\"spare:" + std::to_string(i) + "\",\"pid\":4}\n";
  send_text(c.get(), many);
  size_t relayed = requests.size() + AgentControlSocket::kMaxOpenRequests;
  REQUIRE(pump(
      socket, handlers, [&] { return requests.size() == relayed; }, 5));
  REQUIRE(pump(
      socket, handlers, [&] { return socket.open_requests() == 0; }, 5));
  CHECK(read_reply(c.get(), 5).empty());  // closed, unanswered
  CHECK(requests.size() == relayed);
}

TEST_CASE("agent control socket: its private files go with its folder", "[agent]") {
  std::string folder;
  {
    AgentControlSocket socket;
    folder = socket.folder();
    std::string path = socket.private_path("progress");
    CHECK(fs::path(path).parent_path() == folder);
    std::ofstream(path) << "record";
    REQUIRE(fs::exists(path));
  }
  CHECK_FALSE(fs::exists(folder));
}
