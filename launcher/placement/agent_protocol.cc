// See agent_protocol.h.
#include "launcher/placement/agent_protocol.h"

#include <signal.h>

#include <cstdint>

#include "common/errors.h"
#include "common/json.h"

namespace dtrain::launcher {
namespace {

// A string that can travel through execve: no NUL byte.
std::string exec_string(const common::JsonNode& node) {
  std::string text = node.as_string();
  if (text.find('\0') != std::string::npos) node.fail("contains a NUL character");
  return text;
}

}  // namespace

AgentRequest parse_agent_request(std::string_view line) {
  common::JsonDocument doc = common::JsonDocument::parse(line, "agent request");
  common::JsonNode root = doc.root();
  if (!root.is_object()) {
    root.fail("expected an object {\"argv\": [...], \"env\": [[name, value], ...], \"cwd\": dir}");
  }
  root.check_keys({"argv", "env", "cwd"});
  AgentRequest request;
  common::JsonNode argv = root.at("argv");
  for (const common::JsonNode& arg : argv.as_array()) request.argv.push_back(exec_string(arg));
  if (request.argv.empty() || request.argv[0].empty())
    argv.fail("expected a non-empty list of strings, the program first");
  if (auto env = root.find("env")) {
    for (const common::JsonNode& pair : env->as_array()) {
      std::vector<common::JsonNode> name_value = pair.as_array();
      if (name_value.size() != 2) pair.fail("expected [name, value]");
      std::string name = exec_string(name_value[0]);
      if (name.empty() || name.find('=') != std::string::npos)
        name_value[0].fail("expected a variable name (not empty, no '=')");
      request.env.emplace_back(name, exec_string(name_value[1]));
    }
  }
  if (auto cwd = root.find("cwd")) request.cwd = exec_string(*cwd);
  return request;
}

std::string format_agent_request(const AgentRequest& request) {
  common::JsonWriter w;
  w.begin_object().key("argv").begin_array();
  for (const std::string& arg : request.argv) w.value(arg);
  w.end_array().key("env").begin_array();
  for (const auto& [name, value] : request.env)
    w.begin_array().value(name).value(value).end_array();
  w.end_array().key("cwd").value(request.cwd).end_object();
  return w.str() + "\n";
}

AgentCommand parse_agent_command(std::string_view line) {
  common::JsonDocument doc = common::JsonDocument::parse(line, "agent command");
  common::JsonNode root = doc.root();
  if (!root.is_object())
    root.fail(
        "expected an object {\"signal\": N}, {\"signal\": N, \"value\": V} or "
        "{\"reply\": ID, \"line\": \"...\"}");
  AgentCommand command;
  if (root.find("reply")) {
    root.check_keys({"reply", "line"});
    command.kind = AgentCommand::Kind::kReply;
    command.id = static_cast<uint64_t>(root.at("reply").as_int(0, INT64_MAX));
    command.line = root.at("line").as_string();
    if (command.line.find('\n') != std::string::npos) root.at("line").fail("contains a newline");
    return command;
  }
  root.check_keys({"signal", "value"});
  if (auto value = root.find("value")) {
    command.kind = AgentCommand::Kind::kQueueSignal;
    command.signal = static_cast<int>(root.at("signal").as_int(1, SIGRTMAX));
    command.value = static_cast<int>(value->as_int(INT32_MIN, INT32_MAX));
    return command;
  }
  command.signal = static_cast<int>(root.at("signal").as_int(0, SIGRTMAX));  // 0: a keep-alive
  return command;
}

std::string format_agent_signal_command(int sig) {
  common::JsonWriter w;
  return w.begin_object().key("signal").value(sig).end_object().str() + "\n";
}

std::string format_agent_queue_command(int sig, int value) {
  common::JsonWriter w;
  return w.begin_object().key("signal").value(sig).key("value").value(value).end_object().str() +
         "\n";
}

std::string format_agent_reply_command(uint64_t id, std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  common::JsonWriter w;
  return w.begin_object().key("reply").value(id).key("line").value(line).end_object().str() + "\n";
}

std::string format_relayed_request(const RelayedRequest& request) {
  return std::to_string(request.id) + " " + request.json;
}

std::optional<RelayedRequest> parse_relayed_request(std::string_view payload) {
  size_t space = payload.find(' ');
  if (space == 0 || space == std::string_view::npos || space > 19) return std::nullopt;
  RelayedRequest request;
  for (char c : payload.substr(0, space)) {
    if (c < '0' || c > '9') return std::nullopt;
    request.id = request.id * 10 + static_cast<uint64_t>(c - '0');
  }
  std::string_view json = payload.substr(space + 1);
  if (json.empty() || json.front() != '{') return std::nullopt;
  request.json = std::string(json);
  return request;
}

std::string format_agent_started_event(int pid) {
  common::JsonWriter w;
  return w.begin_object().key("event").value("started").key("pid").value(pid).end_object().str();
}

std::string format_agent_exit_event(const ExitStatus& status) {
  common::JsonWriter w;
  w.begin_object().key("event").value("exit");
  if (status.signaled)
    w.key("signal").value(status.signal);
  else
    w.key("code").value(status.code);
  return w.end_object().str();
}

std::string format_agent_signaled_event(int sig) {
  common::JsonWriter w;
  return w.begin_object()
      .key("event")
      .value("signaled")
      .key("signal")
      .value(sig)
      .end_object()
      .str();
}

std::string format_agent_watch_event(const ProcessSample& process,
                                     const std::optional<common::ProgressSample>& record) {
  common::JsonWriter w;
  w.begin_object().key("event").value("watch");
  w.key("state").value(std::string_view(&process.state, 1));
  w.key("cpu_ticks").value(process.cpu_ticks);
  w.key("run_ns").value(process.run_ns).key("wait_ns").value(process.wait_ns);
  w.key("runnable").value(process.runnable);
  if (record) {
    w.key("record").begin_object();
    w.key("pid").value(record->pid).key("generation").value(record->generation);
    w.key("begun").value(record->begun).key("ended").value(record->ended);
    w.key("global_step").value(record->global_step);
    w.key("step_micros").value(static_cast<uint64_t>(record->step_seconds * 1e6 + 0.5));
    w.key("phase").value(static_cast<uint64_t>(record->phase));
    w.end_object();
  }
  return w.end_object().str();
}

AgentLine classify_agent_line(std::string_view line) {
  if (line.substr(0, kLineMarker.size()) == kLineMarker)
    return {AgentLine::Kind::kOutput, line.substr(kLineMarker.size())};
  std::string_view text = line;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  for (auto [marker, kind] : {std::pair{kControlMarker, AgentLine::Kind::kControl},
                              std::pair{kEventMarker, AgentLine::Kind::kEvent},
                              std::pair{kRequestMarker, AgentLine::Kind::kRequest}}) {
    if (text.substr(0, marker.size()) == marker) return {kind, text.substr(marker.size())};
  }
  return {AgentLine::Kind::kOutput, line};
}

std::optional<AgentEvent> parse_agent_event(std::string_view payload) {
  try {
    common::JsonDocument doc = common::JsonDocument::parse(payload, "agent event");
    common::JsonNode root = doc.root();
    AgentEvent event;
    std::string type = root.at("event").as_string();
    if (type == "started") {
      event.type = AgentEvent::Type::kStarted;
      event.pid = static_cast<int>(root.at("pid").as_int(1, 1 << 30));
    } else if (type == "signaled") {
      event.type = AgentEvent::Type::kSignaled;
      event.signal = static_cast<int>(root.at("signal").as_int(1, SIGRTMAX));
    } else if (type == "exit") {
      event.type = AgentEvent::Type::kExit;
      if (auto sig = root.find("signal"))
        event.status = ExitStatus::killed(static_cast<int>(sig->as_int(1, SIGRTMAX)));
      else
        event.status = ExitStatus::exited(static_cast<int>(root.at("code").as_int(0, 255)));
    } else if (type == "watch") {
      event.type = AgentEvent::Type::kWatch;
      std::string state = root.at("state").as_string();
      if (state.size() != 1) root.at("state").fail("expected one letter");
      event.process.state = state[0];
      event.process.cpu_ticks = static_cast<uint64_t>(root.at("cpu_ticks").as_int(0, INT64_MAX));
      if (auto run = root.find("run_ns")) event.process.run_ns = run->as_int(0, INT64_MAX);
      if (auto wait = root.find("wait_ns")) event.process.wait_ns = wait->as_int(0, INT64_MAX);
      auto runnable = root.find("runnable");  // an older agent: the process's own letter
      event.process.runnable = runnable ? runnable->as_bool() : event.process.state == 'R';
      event.process.readable = true;
      if (auto record = root.find("record")) {
        common::ProgressSample r;
        r.pid = static_cast<int>(record->at("pid").as_int(0, INT32_MAX));
        r.generation = static_cast<int>(record->at("generation").as_int(0, INT32_MAX));
        r.begun = static_cast<uint64_t>(record->at("begun").as_int(0, INT64_MAX));
        r.ended = static_cast<uint64_t>(record->at("ended").as_int(0, INT64_MAX));
        r.global_step = static_cast<uint64_t>(record->at("global_step").as_int(0, INT64_MAX));
        r.step_seconds = static_cast<double>(record->at("step_micros").as_int(0, INT64_MAX)) / 1e6;
        if (auto phase = record->find("phase"))
          r.phase = common::progress_phase(static_cast<uint64_t>(phase->as_int(0, INT64_MAX)));
        event.record = r;
      }
    } else {
      return std::nullopt;
    }
    return event;
  } catch (const common::ConfigError&) {
    return std::nullopt;
  }
}

}  // namespace dtrain::launcher
