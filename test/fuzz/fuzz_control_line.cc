// Lines the launcher reads from processes it does not trust: control-socket lines from workers
// (common/control_protocol.h: messages, and the reform requests and replies of in-place
// recovery, with an elastic group's members) and an agent's stdout events and stdin requests
// (launcher/placement/agent_protocol.h). What parses formats back to a line that parses the same.
#include <string_view>
#include <vector>

#include "common/control_protocol.h"
#include "launcher/placement/agent_protocol.h"
#include "test/fuzz/fuzz_support.h"

namespace {

// Elastic members' text ("0,2,3", common/control_protocol.h): refused cleanly, or read as ranks
// that format to text which reads the same.
void members_round_trip(std::string_view text) {
  using namespace dtrain;
  constexpr int kSize = 1024;
  std::vector<int> members;
  if (!fuzz::accepts([&] { members = common::parse_members(text, kSize, "fuzz"); })) return;
  fuzz::require(!members.empty(), "members are never none");
  std::vector<int> again = common::parse_members(common::format_members(members), kSize, "fuzz");
  fuzz::require(again == members, "formatted members read the same");
}

}  // namespace

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
    fuzz::require(!reply->ok || again->members == reply->members,
                  "a reform reply keeps its members");
    members_round_trip(reply->members);
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
    fuzz::require(!assignment->ok || again->members == assignment->members,
                  "a spare assignment keeps its members");
    members_round_trip(assignment->members);
  }
  members_round_trip(line);  // DTRAIN_MEMBERS as a worker reads it
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
