// Lines the launcher reads from processes it does not trust: control-socket lines from workers
// (common/control_protocol.h: messages, and the reform requests and replies of in-place
// recovery) and an agent's stdout events and stdin requests (launcher/agent_protocol.h). What
// parses formats back to a line that parses the same.
#include "common/control_protocol.h"
#include "launcher/agent_protocol.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  const std::string_view line = fuzz::as_text(data, size);
  if (auto message = common::parse_control_message(line)) {
    std::string text = common::format_control_message(*message);
    fuzz::require(!text.empty() && text.back() == '\n', "a control line ends in a newline");
    text.pop_back();
    auto again = common::parse_control_message(text);
    fuzz::require(again.has_value(), "a formatted control line parses");
    fuzz::require(common::format_control_message(*again) == text + "\n",
                  "a control line formats the same after a round trip");
  }
  if (auto request = common::parse_reform_request(line)) {
    std::string text = common::format_reform_request(*request);
    text.pop_back();
    auto again = common::parse_reform_request(text);
    fuzz::require(again.has_value(), "a formatted reform request parses");
    fuzz::require(common::format_reform_request(*again) == text + "\n",
                  "a reform request formats the same after a round trip");
  }
  if (auto reply = common::parse_reform_reply(line)) {
    std::string text = common::format_reform_reply(*reply);
    text.pop_back();
    auto again = common::parse_reform_reply(text);
    fuzz::require(again.has_value() && again->ok == reply->ok, "a formatted reform reply parses");
  }
  if (auto request = common::parse_spare_request(line)) {
    std::string text = common::format_spare_request(*request);
    text.pop_back();
    fuzz::require(common::parse_spare_request(text).has_value(),
                  "a formatted spare request parses");
  }
  if (auto assignment = common::parse_spare_assignment(line)) {
    std::string text = common::format_spare_assignment(*assignment);
    text.pop_back();
    auto again = common::parse_spare_assignment(text);
    fuzz::require(again.has_value() && again->task == assignment->task,
                  "a formatted spare assignment parses");
  }
  const launcher::AgentLine kind = launcher::classify_agent_line(line);
  if (kind.kind == launcher::AgentLine::Kind::kEvent) launcher::parse_agent_event(kind.payload);
  if (auto event = launcher::parse_agent_event(line);
      event && event->type == launcher::AgentEvent::Type::kWatch) {
    auto again = launcher::parse_agent_event(
        launcher::format_agent_watch_event(event->process, event->record));
    fuzz::require(again.has_value() && again->process.cpu_ticks == event->process.cpu_ticks &&
                      again->record.has_value() == event->record.has_value(),
                  "a formatted watch event parses");
  }
  if (auto relayed = launcher::parse_relayed_request(line)) {
    auto again = launcher::parse_relayed_request(launcher::format_relayed_request(*relayed));
    fuzz::require(again.has_value() && again->id == relayed->id && again->json == relayed->json,
                  "a formatted relayed request parses");
  }
  fuzz::accepts([&] { launcher::parse_agent_command(line); });
  launcher::AgentRequest request;
  if (fuzz::accepts([&] { request = launcher::parse_agent_request(line); })) {
    std::string text = launcher::format_agent_request(request);
    text.pop_back();
    fuzz::require(fuzz::accepts([&] { launcher::parse_agent_request(text); }),
                  "a formatted agent request parses");
  }
  return 0;
}
