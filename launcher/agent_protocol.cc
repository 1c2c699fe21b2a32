// See agent_protocol.h.
#include "launcher/agent_protocol.h"

#include <signal.h>

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

int parse_agent_signal_command(std::string_view line) {
  common::JsonDocument doc = common::JsonDocument::parse(line, "agent command");
  common::JsonNode root = doc.root();
  if (!root.is_object()) root.fail("expected an object {\"signal\": N}");
  root.check_keys({"signal"});
  return static_cast<int>(root.at("signal").as_int(0, SIGRTMAX));  // 0: only a keep-alive
}

std::string format_agent_signal_command(int sig) {
  common::JsonWriter w;
  return w.begin_object().key("signal").value(sig).end_object().str() + "\n";
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

AgentLine classify_agent_line(std::string_view line) {
  if (line.substr(0, kLineMarker.size()) == kLineMarker)
    return {AgentLine::Kind::kOutput, line.substr(kLineMarker.size())};
  std::string_view text = line;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  for (auto [marker, kind] : {std::pair{kControlMarker, AgentLine::Kind::kControl},
                              std::pair{kEventMarker, AgentLine::Kind::kEvent}}) {
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
    } else {
      return std::nullopt;
    }
    return event;
  } catch (const common::ConfigError&) {
    return std::nullopt;
  }
}

}  // namespace dtrain::launcher
