// Control lines between workers and the launcher: the message type is one of three names, the
// "steps redone" fields (global_step, restored_step) and the straggler fields
// (compute_seconds_per_step, wait_seconds_per_step) round-trip, unknown keys are tolerated and
// malformed values refused.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/control_protocol.h"
#include "common/errors.h"
#include "test/support/temp_dir.h"

using namespace dtrain::common;

TEST_CASE("control messages round-trip, global_step and restored_step included") {
  ControlMessage m;
  m.type = ControlMessageType::kProgress;
  m.task = "worker:1";
  m.attempt = 2;
  m.epoch = 1, m.epochs = 3, m.step = 7, m.steps = 70;
  m.loss = 0.5;
  m.global_step = (int64_t{1} << 40) + 7;
  std::string line = format_control_message(m);
  CHECK(line.find(R"("type":"progress")") != std::string::npos);
  CHECK(line.find(R"("global_step":1099511627783)") != std::string::npos);
  CHECK(line.find("restored_step") == std::string::npos);  // absent stays absent
  line.pop_back();
  std::optional<ControlMessage> back = parse_control_message(line);
  REQUIRE(back);
  CHECK(back->type == ControlMessageType::kProgress);
  CHECK(back->global_step == m.global_step);
  CHECK_FALSE(back->restored_step);
  CHECK(back->step == 7);

  ControlMessage restored = heartbeat_message("worker:0", 1, 123);
  restored.restored_step = 0;
  back = parse_control_message(format_control_message(restored));
  REQUIRE(back);
  CHECK(back->type == ControlMessageType::kHeartbeat);
  CHECK(back->restored_step == 0);
  CHECK(back->pid == 123);
}

TEST_CASE("each message type has its wire name; an unknown type is malformed") {
  for (auto [type, name] : {std::pair{ControlMessageType::kHello, "hello"},
                            {ControlMessageType::kHeartbeat, "heartbeat"},
                            {ControlMessageType::kProgress, "progress"}}) {
    CHECK(std::string(control_message_type_name(type)) == name);
    auto m = parse_control_message(std::string(R"({"type":")") + name +
                                   R"(","task":"worker:0","attempt":0})");
    REQUIRE(m);
    CHECK(m->type == type);
  }
  CHECK_FALSE(parse_control_message(R"({"type":"bye","task":"worker:0","attempt":0})"));
  CHECK_FALSE(parse_control_message(R"({"type":3,"task":"worker:0","attempt":0})"));
}

TEST_CASE("unknown keys are tolerated; malformed step fields are refused") {
  const std::string head = R"({"type":"progress","task":"worker:0","attempt":0,)";
  auto m = parse_control_message(head + R"("future":{"x":1},"global_step":12})");
  REQUIRE(m);
  CHECK(m->global_step == 12);
  CHECK(parse_control_message(head + R"("restored_step":null})").has_value());
  for (const char* bad : {R"("global_step":-1})", R"("global_step":1.5})",
                          R"("restored_step":"3"})", R"("restored_step":1e300})"}) {
    INFO(bad);
    CHECK_FALSE(parse_control_message(head + bad));
  }
}

TEST_CASE("compute and all-reduce wait per step round-trip; absent stays absent") {
  ControlMessage m;
  m.type = ControlMessageType::kProgress;
  m.task = "worker:1";
  m.compute_seconds_per_step = 0.0421875;  // exact in binary: the text round-trips exactly
  m.wait_seconds_per_step = 0.001953125;
  std::string line = format_control_message(m);
  CHECK(line.find(R"("compute_seconds_per_step":0.0421875)") != std::string::npos);
  CHECK(line.find(R"("wait_seconds_per_step":0.001953125)") != std::string::npos);
  line.pop_back();
  std::optional<ControlMessage> back = parse_control_message(line);
  REQUIRE(back);
  CHECK(back->compute_seconds_per_step == 0.0421875);
  CHECK(back->wait_seconds_per_step == 0.001953125);

  ControlMessage plain = heartbeat_message("worker:0", 0, 7);
  std::string text = format_control_message(plain);
  CHECK(text.find("seconds_per_step") == std::string::npos);
  back = parse_control_message(text.substr(0, text.size() - 1));
  REQUIRE(back);
  CHECK_FALSE(back->compute_seconds_per_step);
  CHECK_FALSE(back->wait_seconds_per_step);

  const std::string head = R"({"type":"progress","task":"worker:0","attempt":0,)";
  CHECK(parse_control_message(head + R"("wait_seconds_per_step":null})").has_value());
  for (const char* bad :
       {R"("compute_seconds_per_step":-0.5})", R"("wait_seconds_per_step":"0.1"})"}) {
    INFO(bad);
    CHECK_FALSE(parse_control_message(head + bad));
  }
}

TEST_CASE("reform requests and replies round-trip; other lines are not replies") {
  ReformRequest request{"worker:2", 1, 3, 386, true, "worker:1 (rank 1): connection closed"};
  std::string line = format_reform_request(request);
  REQUIRE(line.back() == '\n');
  std::optional<ReformRequest> back = parse_reform_request(line);
  REQUIRE(back);
  CHECK(back->task == "worker:2");
  CHECK(back->attempt == 1);
  CHECK(back->generation == 3);
  CHECK(back->whole_step == 386);
  CHECK(back->in_flight);
  CHECK(back->what == request.what);
  CHECK_FALSE(parse_reform_request(R"({"request": "status"})"));
  CHECK_FALSE(parse_reform_request(R"({"request": "reform", "task": "w"})"));
  CHECK_FALSE(parse_reform_request(
      R"({"request": "reform", "task": "w", "attempt": 0, "generation": -1, "whole_step": 0})"));

  std::optional<ReformReply> ok = parse_reform_reply(format_reform_reply({true, 4, ""}));
  REQUIRE(ok);
  CHECK(ok->ok);
  CHECK(ok->generation == 4);
  std::optional<ReformReply> no =
      parse_reform_reply(format_reform_reply({false, 0, "the job is stopping"}));
  REQUIRE(no);
  CHECK_FALSE(no->ok);
  CHECK(no->error == "the job is stopping");
  CHECK_FALSE(parse_reform_reply(R"({"ok": false, "error": "malformed line"})"));
  CHECK_FALSE(parse_reform_reply("not json"));
}

namespace {

// A launcher stand-in on a real UNIX socket: reads one line, then writes `replies` after delay_ms.
struct OneShotServer {
  OneShotServer(const std::string& path, std::string replies, int delay_ms)
      : listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener, 4) == 0);
    thread = std::thread([this, replies, delay_ms] {
      int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) return;
      char c = 0;
      while (::read(fd, &c, 1) == 1 && c != '\n') request.push_back(c);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      (void)!::write(fd, replies.data(), replies.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::close(fd);
    });
  }
  ~OneShotServer() {
    thread.join();
    ::close(listener);
  }
  int listener;
  std::string request;
  std::thread thread;
};

}  // namespace

TEST_CASE("request_reform waits for the launcher's reply, skipping other lines, or times out") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/control.sock";
  ReformRequest request{"worker:0", 0, 0, 12, false, "lost worker:1"};
  {
    OneShotServer server(
        path, "{\"ok\": false, \"error\": \"malformed\"}\n" + format_reform_reply({true, 1, ""}),
        200);
    ControlClient client("unix:" + path);
    std::optional<ReformReply> reply = client.request_reform(request, 10);
    REQUIRE(reply);
    CHECK(reply->ok);
    CHECK(reply->generation == 1);
    std::optional<ReformRequest> seen = parse_reform_request(server.request);
    REQUIRE(seen);
    CHECK(seen->whole_step == 12);
  }
  ::unlink(path.c_str());
  {
    OneShotServer silent(path, "", 0);  // answers nothing
    ControlClient client("unix:" + path);
    CHECK_FALSE(client.request_reform(request, 0.3));
  }
  ControlClient unset("");
  CHECK_FALSE(unset.request_reform(request, 0.1));
}

TEST_CASE("spare requests and assignments round-trip; other lines are not assignments") {
  std::optional<SpareRequest> request =
      parse_spare_request(format_spare_request({"spare:0", 4242}));
  REQUIRE(request);
  CHECK(request->spare == "spare:0");
  CHECK(request->pid == 4242);
  CHECK_FALSE(parse_spare_request(R"({"request": "spare", "spare": "spare:0", "pid": 0})"));

  SpareAssignment place{true, "worker:1", 2, R"({"cluster": {}, "task": {}})", ""};
  std::optional<SpareAssignment> back = parse_spare_assignment(format_spare_assignment(place));
  REQUIRE(back);
  CHECK(back->ok);
  CHECK(back->task == "worker:1");
  CHECK(back->generation == 2);
  CHECK(back->tf_config == place.tf_config);
  std::optional<SpareAssignment> no =
      parse_spare_assignment(format_spare_assignment({false, "", 0, "", "the job has ended"}));
  REQUIRE(no);
  CHECK_FALSE(no->ok);
  CHECK(no->error == "the job has ended");
  CHECK_FALSE(parse_spare_assignment(format_reform_reply({true, 1, ""})));
}

// The question a worker in place asks about a SIGTERM from elsewhere (issue 43), and its answer.
TEST_CASE("sigterm queries and answers round-trip; other lines are not answers") {
  std::optional<SigtermQuery> query =
      parse_sigterm_query(format_sigterm_query({"worker:1", 3, 4242}));
  REQUIRE(query);
  CHECK(query->task == "worker:1");
  CHECK(query->attempt == 3);
  CHECK(query->sender == 4242);
  CHECK_FALSE(parse_sigterm_query(R"({"request": "sigterm", "task": "worker:1"})"));
  CHECK_FALSE(parse_sigterm_query(format_reform_request({"worker:1", 0, 0, -1, false, ""})));

  CHECK(parse_sigterm_answer(format_sigterm_answer(true)) == std::optional<bool>(true));
  CHECK(parse_sigterm_answer(format_sigterm_answer(false)) == std::optional<bool>(false));
  // A refusal (the sender check: not the task's process) is no job stop.
  CHECK(parse_sigterm_answer(R"({"request":"sigterm","ok":false,"error":"pid 7"})") ==
        std::optional<bool>(false));
  CHECK_FALSE(parse_sigterm_answer(format_reform_reply({true, 1, ""})));
  CHECK_FALSE(parse_sigterm_answer(R"({"ok": true})"));
}

TEST_CASE("members: ring ranks format as \"0,2,3\" and parse back; empty text is everyone") {
  CHECK(format_members({}).empty());
  CHECK(format_members({0}) == "0");
  CHECK(format_members({0, 2, 3}) == "0,2,3");
  for (const std::vector<int>& members : std::vector<std::vector<int>>{
           {0}, {7}, {0, 1}, {1, 3, 5, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, {2, 6}}) {
    INFO(format_members(members));
    CHECK(parse_members(format_members(members), 8, "DTRAIN_MEMBERS") == members);
  }
  CHECK(parse_members("", 3, "DTRAIN_MEMBERS") == std::vector<int>{0, 1, 2});
  CHECK(parse_members("1000", 1001, "x") == std::vector<int>{1000});
}

TEST_CASE("members: a malformed list is a ConfigError naming its source and the text") {
  struct Bad {
    const char* text;
    const char* why;
  };
  for (Bad bad :
       {Bad{"0,,2", "\"\" is not a rank"}, Bad{"0,a", "\"a\" is not a rank"},
        Bad{"0,4", "rank 4 is outside the cluster"}, Bad{"2,1", "ranks out of order or repeated"},
        Bad{"1,1", "ranks out of order or repeated"}, Bad{"-1,2", "rank -1 is outside the cluster"},
        Bad{"99999999999999999999", "\"99999999999999999999\" is not a rank"},
        Bad{"2147483648", "\"2147483648\" is not a rank"}, Bad{"0,1,", "\"\" is not a rank"},
        Bad{",0", "\"\" is not a rank"}, Bad{" 1", "\" 1\" is not a rank"},
        Bad{"+1", "\"+1\" is not a rank"}, Bad{"1.5", "\"1.5\" is not a rank"},
        Bad{"0x1", "\"0x1\" is not a rank"}}) {
    INFO(bad.text);
    try {
      parse_members(bad.text, 4, "DTRAIN_MEMBERS");
      FAIL("accepted");
    } catch (const ConfigError& e) {
      std::string message = e.what();
      INFO(message);
      CHECK(message.rfind(std::string("DTRAIN_MEMBERS: \"") + bad.text + "\": ", 0) == 0);
      CHECK(message.find(bad.why) != std::string::npos);
      CHECK(message.find("below 4") != std::string::npos);
    }
  }
}

TEST_CASE("reform replies and spare assignments carry the members only when some are away") {
  std::string everyone = format_reform_reply({true, 2, "", ""});
  CHECK(everyone.find("members") == std::string::npos);
  std::optional<ReformReply> back = parse_reform_reply(everyone);
  REQUIRE(back);
  CHECK(back->generation == 2);
  CHECK(back->members.empty());
  std::string some = format_reform_reply({true, 3, "", "0,2"});
  CHECK(some.find(R"("members":"0,2")") != std::string::npos);
  back = parse_reform_reply(some);
  REQUIRE(back);
  CHECK(back->ok);
  CHECK(back->generation == 3);
  CHECK(back->members == "0,2");
  // A refusal has no members; members of another type make the reply malformed.
  CHECK(format_reform_reply({false, 0, "no", "0,2"}).find("members") == std::string::npos);
  CHECK_FALSE(parse_reform_reply(R"({"request":"reform","ok":true,"generation":1,"members":[0]})"));

  SpareAssignment place{true, "worker:2", 4, R"({"cluster": {}})", "", "0,1,2"};
  std::string line = format_spare_assignment(place);
  CHECK(line.find(R"("members":"0,1,2")") != std::string::npos);
  std::optional<SpareAssignment> assigned = parse_spare_assignment(line);
  REQUIRE(assigned);
  CHECK(assigned->task == "worker:2");
  CHECK(assigned->generation == 4);
  CHECK(assigned->tf_config == place.tf_config);
  CHECK(assigned->members == "0,1,2");
  place.members.clear();
  line = format_spare_assignment(place);
  CHECK(line.find("members") == std::string::npos);
  assigned = parse_spare_assignment(line);
  REQUIRE(assigned);
  CHECK(assigned->members.empty());
  CHECK_FALSE(parse_spare_assignment(
      R"({"request":"spare","ok":true,"task":"worker:1","generation":1,"tf_config":"{}",)"
      R"("members":7})"));
}
