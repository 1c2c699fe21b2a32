// Slurm's word on a node is a side run, never a wait on the launcher's loop
// (docs/design.md#elastic-membership): a fake `scontrol` first on PATH (a real process at the OS
// seam; test_slurm_elastic.cc asks the real one) takes 5 s to answer, and meanwhile heartbeats
// are taken in, reform requests answered and the freeze watch looks. What the answer decides (a
// drained node's workers leave, a node back is joined again) comes after, as it did before.
// The workers are the fake spawner's, Slurm steps behind the real agent child.
#include <unistd.h>

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "common/control_protocol.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/placement/slurm.h"
#include "test/launcher/fake_spawner.h"
#include "test/launcher/supervisor_harness.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
using launcher::ExitStatus;
using testing::FakeProcess;
using testing::reform_reply;

namespace {

// n1 runs worker:0 (the chief) and worker:1, n2 worker:2 and worker:3.
const std::string kJob =
    R"({"job": "slurm-questions", "freeze_seconds": 2, "cluster": {"worker": ["198.51.100.1:1",
        "198.51.100.1:2", "198.51.100.2:1", "198.51.100.2:2"]}, "train": {},
        "elastic": {"min_workers": 2}, "restart": {"max_restarts": 3, "grace_seconds": 0.2,
        "startup_seconds": 0, "max_preemptions": 5, "backoff_seconds": 0.01}})";

// `scontrol -o show node NODE`: notes each question in `asked`; n2 answers after 5 s. The
// State is state-NODE's text (ALLOCATED when there is none).
const char* const kFakeScontrol = R"sh(#!/bin/sh
here=$(dirname "$0")
echo "$4" >> "$here/asked"
if [ "$4" = n2 ]; then sleep 5; fi
echo "NodeName=$4 Arch=x86_64 State=$(cat "$here/state-$4" 2>/dev/null || echo ALLOCATED)"
)sh";

// The fake scontrol, first on PATH while it lives.
struct FakeScontrol {
  testing::TempDir dir;
  std::string old_path;
  explicit FakeScontrol(const std::string& n2_state) {
    std::string path = dir.path() + "/scontrol";
    std::ofstream(path) << kFakeScontrol;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    std::ofstream(dir.path() + "/state-n2") << n2_state;
    const char* was = std::getenv("PATH");
    old_path = was ? was : "";
    ::setenv("PATH", (dir.path() + ":" + old_path).c_str(), 1);
  }
  ~FakeScontrol() { ::setenv("PATH", old_path.c_str(), 1); }
  std::string asked() const {
    std::ifstream in(dir.path() + "/asked");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

std::string agent_line(const std::string& marker, const std::string& payload) {
  return "\x1e" + marker + " " + payload + "\n";
}
std::string without_newline(std::string line) {
  if (!line.empty() && line.back() == '\n') line.pop_back();
  return line;
}
// The agent's watch event: dtrain-worker's loop runs, its process in state (S, or T: stopped).
std::string watch_event(char state) {
  return agent_line("dtrain-agent", std::string(R"({"event":"watch","state":")") + state +
                                        R"(","cpu_ticks":9,"record":{"pid":42,"generation":0,)"
                                        R"("begun":7,"ended":7,"global_step":3,)"
                                        R"("step_micros":20000}})");
}
std::string reform_request(const std::string& task, int generation) {
  return without_newline(common::format_reform_request(
      {task, 0, generation, 20, true, "worker:3 (rank 3): connection closed"}));
}
std::string task_of(const FakeProcess& p) {
  if (std::string spare = p.env("DTRAIN_SPARE"); !spare.empty()) return spare;
  std::string tf = p.env("TF_CONFIG");
  return "worker:" + tf.substr(tf.find("\"index\": ") + 9, 1);
}

// Four Slurm steps on n1 and n2; scontrol's questions go to the real spawner.
struct SlurmJob : testing::SupervisorHarness {
  SlurmJob(testing::FakeSpawner::Script script, double question_seconds)
      : SupervisorHarness(kJob, std::move(script),
                          {{},
                           {},
                           [](launcher::LaunchContext& c) {
                             c.worker_program = "/fake/dtrain-worker";
                             launcher::SlurmAllocation a;
                             a.job_id = "77";
                             a.tasks = {{"n1", "198.51.100.1:1"},
                                        {"n1", "198.51.100.1:2"},
                                        {"n2", "198.51.100.2:1"},
                                        {"n2", "198.51.100.2:2"}};
                             c.cluster = a.cluster();
                             c.slurm = a;
                           },
                           {},
                           [=](launcher::SupervisorOptions& o) {
                             o.reform_hold_seconds = 2;  // shorter than Slurm's 5 s
                             o.rejoin_first_seconds = 0.05;
                             o.rejoin_most_seconds = 1;
                             o.slurm_question_seconds = question_seconds;
                           }},
                          {"scontrol"}) {}

  FakeProcess& process(size_t i) { return *spawner.processes.at(i); }
  void relay(FakeProcess& p, uint64_t id, const std::string& json) {
    p.print(agent_line("dtrain-request", std::to_string(id) + " " + json));
  }
  /// A progress message of task through its agent, at global step.
  void progress(FakeProcess& p, const std::string& task, int64_t step) {
    common::ControlMessage m;
    m.type = common::ControlMessageType::kProgress;
    m.task = task;
    m.global_step = step;
    p.print(std::string(launcher::kControlMarker) +
            without_newline(common::format_control_message(m)) + "\n");
  }
  int64_t reported_step(const std::string& task) const {
    for (const auto& t : supervisor->snapshot().tasks)
      if (t.task == task && t.progress && t.progress->global_step) return *t.progress->global_step;
    return -1;
  }
  /// Runs body every 50 ms on the loop until the job ends.
  void every_tick(std::function<void()> body) {
    auto timer = std::make_shared<boost::asio::steady_timer>(io);
    auto tick = std::make_shared<std::function<void()>>();
    *tick = [this, timer, body, weak = std::weak_ptr<std::function<void()>>(tick)] {
      timer->expires_after(std::chrono::milliseconds(50));
      timer->async_wait([this, body, weak](const boost::system::error_code& ec) {
        if (ec || done) return;
        body();
        if (auto again = weak.lock()) (*again)();
      });
    };
    ticks.push_back(tick);
    (*tick)();
  }
  std::vector<std::shared_ptr<std::function<void()>>> ticks;
};

}  // namespace

// worker:3 fails on n2 while its agent still reports: a drained node still runs new steps, so
// the launcher asks Slurm before it replaces it, and holds the end meanwhile. The survivors'
// reform requests wait for the decision (past reform_hold_seconds: an end explains them); a
// heartbeat and an impossible request are taken in and answered at once. Slurm says n2 is
// drained: n2's workers leave and the survivors re-form as generation 1 of members 0,1.
TEST_CASE("slurm questions: a failed end waits for a slow scontrol; the loop goes on") {
  FakeScontrol scontrol("MIXED+DRAIN");
  SlurmJob* h = nullptr;
  SlurmJob job(
      [&](FakeProcess& p) {
        p.print(agent_line("dtrain-agent", R"({"event":"started","pid":42})"));
        p.print(watch_event('S'));
        if (task_of(p) != "worker:3") return;
        boost::asio::post(*p.io, [&] {  // all four run; worker:3 fails there
          h->relay(h->process(0), 1, reform_request("worker:0", 0));
          h->relay(h->process(1), 1, reform_request("worker:1", 0));
          h->process(3).print(agent_line("dtrain-agent", R"({"event":"exit","code":1})"));
          h->process(3).end(ExitStatus::exited(1));
        });
      },
      10);
  h = &job;
  std::vector<std::string> order;  // what was seen, and whether n2 had left by then
  bool asked = false, heartbeat = false, refused = false, shrunk = false;
  job.every_tick([&] {
    const bool left = job.has_event("shrink");
    if (!asked && scontrol.asked() == "n2\n") {  // Slurm is being asked: speak meanwhile
      asked = true;
      order.push_back(left ? "asked after the shrink" : "asked");
      job.progress(job.process(0), "worker:0", 77);
      job.relay(job.process(1), 2, reform_request("worker:1", 3));  // never formed: refused
    }
    if (asked && !heartbeat && job.reported_step("worker:0") == 77) {
      heartbeat = true;
      order.push_back(left ? "heartbeat after the shrink" : "heartbeat");
    }
    if (asked && !refused && job.process(1).replies().size() >= 1 &&
        !reform_reply(job.process(1).replies().back()).ok) {
      refused = true;
      order.push_back(left ? "refusal after the shrink" : "refusal");
    }
    if (!shrunk && left) {
      shrunk = true;
      order.push_back("shrink");
      job.supervisor->stop(SIGTERM);
    }
  });
  auto r = job.run(30);
  INFO(job.events());
  CHECK(r.status == "stopped");
  REQUIRE(order.size() == 4);
  CHECK(order.front() == "asked");
  CHECK(order.back() == "shrink");
  CHECK(std::count(order.begin(), order.end(), "heartbeat") == 1);
  CHECK(std::count(order.begin(), order.end(), "refusal") == 1);
  std::string events = job.events();
  CHECK(events.find(R"("event":"shrink","attempt":0,"generation":1,"world_size":2,"host":"n2",)"
                    R"("tasks":["worker:2","worker:3"],"members":"0,1",)") != std::string::npos);
  CHECK(events.find("Slurm has node n2 MIXED+DRAIN") != std::string::npos);
  CHECK(events.find(R"("event":"in_place")") == std::string::npos);  // not replaced on n2
  CHECK(events.find(R"("event":"teardown","attempt":0,"reason":"launcher got SIGTERM"})") !=
        std::string::npos);  // the test's stop, and no other
  CHECK(events.find(R"("event":"teardown")") == events.rfind(R"("event":"teardown")"));
  CHECK(job.supervisor->book().restarts() == 0);
  // The survivors' requests of generation 0 were held past reform_hold_seconds and answered with
  // the decision; the impossible one was refused at once.
  for (size_t survivor : {0, 1}) {
    INFO("worker:" << survivor);
    std::vector<std::string> replies = job.process(survivor).replies();
    REQUIRE(!replies.empty());
    std::string held = survivor == 0 ? replies.front() : replies.back();
    CHECK(reform_reply(held).ok);
    CHECK(reform_reply(held).generation == 1);
    CHECK(reform_reply(held).members == "0,1");
  }
  CHECK(reform_reply(job.process(1).replies().front()).error.find("never formed") !=
        std::string::npos);
}

// n2 is left at once when its sessions end (srun lost the node); each try to join it again asks
// Slurm first. The question takes 5 s; meanwhile a late reform request is answered with the
// generation already formed, a progress message is taken in, and the freeze watch warns of a
// stopped member (which then goes on, so it is not killed). Slurm says n2 is usable: its
// workers start as joiners and the group grows back to four.
TEST_CASE("slurm questions: a node's try waits for a slow scontrol; the freeze watch goes on") {
  FakeScontrol scontrol("IDLE");
  SlurmJob* h = nullptr;
  char worker1_state = 'S';
  SlurmJob job(
      [&](FakeProcess& p) {
        p.print(agent_line("dtrain-agent", R"({"event":"started","pid":42})"));
        p.print(watch_event('S'));
        if (std::string joiner = p.env("DTRAIN_SPARE"); !joiner.empty()) {
          h->relay(p, 9, without_newline(common::format_spare_request({joiner, 42})));
          return;
        }
        if (task_of(p) != "worker:3") return;
        boost::asio::post(*p.io, [&] {  // all four run; n2's sessions end: srun lost the node
          h->relay(h->process(0), 1, reform_request("worker:0", 0));
          h->relay(h->process(1), 1, reform_request("worker:1", 0));
          h->process(2).end(ExitStatus::exited(1));
          h->process(3).end(ExitStatus::exited(1));
        });
      },
      10);
  h = &job;
  std::vector<std::string> order;
  bool asked = false, answered = false, heartbeat = false, stalled = false, grown = false;
  job.every_tick([&] {
    // The members' agents report as real ones do (every 0.5 s); worker:1's as told.
    if (job.spawner.processes.size() >= 2) {
      job.process(0).print(watch_event('S'));
      job.process(1).print(watch_event(worker1_state));
    }
    const bool joined = job.spawner.processes.size() > 4;  // n2's joiners started
    if (!asked && scontrol.asked() == "n2\n") {
      asked = true;
      order.push_back(joined ? "asked after the joiners" : "asked");
      worker1_state = 'T';  // stopped: the freeze watch warns after freeze_seconds
      job.relay(job.process(0), 2, reform_request("worker:0", 0));  // late: answered at once
      job.progress(job.process(0), "worker:0", 77);
    }
    if (asked && !answered && job.process(0).replies().size() == 2) {
      answered = true;
      order.push_back(joined ? "reform after the joiners" : "reform");
    }
    if (asked && !heartbeat && job.reported_step("worker:0") == 77) {
      heartbeat = true;
      order.push_back(joined ? "heartbeat after the joiners" : "heartbeat");
    }
    if (asked && !stalled && job.has_event("stall")) {
      stalled = true;
      order.push_back(joined ? "stall after the joiners" : "stall");
      worker1_state = 'S';  // it goes on before the watch's verdict is final
    }
    if (!grown && job.has_event("grow")) {
      grown = true;
      order.push_back("grow");
      job.supervisor->stop(SIGTERM);
    }
  });
  auto r = job.run(30);
  INFO(job.events());
  CHECK(r.status == "stopped");
  REQUIRE(order.size() == 5);
  CHECK(order.front() == "asked");
  CHECK(order.back() == "grow");
  for (const char* during : {"reform", "heartbeat", "stall"})
    CHECK(std::count(order.begin(), order.end(), during) == 1);
  CHECK(scontrol.asked() == "n2\n");  // one question, asked for the try
  std::string events = job.events();
  CHECK(events.find(R"("event":"shrink","attempt":0,"generation":1,"world_size":2,"host":"n2",)") !=
        std::string::npos);
  CHECK(events.find(R"("event":"stall","task":"worker:1",)") != std::string::npos);
  CHECK(events.find(R"("event":"frozen")") == std::string::npos);
  CHECK(events.find(R"("event":"grow","attempt":0,"generation":2,"world_size":4,"host":"n2",)") !=
        std::string::npos);
  std::vector<std::string> replies = job.process(0).replies();
  REQUIRE(replies.size() >= 2);
  CHECK(reform_reply(replies[1]).ok);
  CHECK(reform_reply(replies[1]).generation == 1);
  CHECK(reform_reply(replies[1]).members == "0,1");
}

// Slurm that does not answer within slurm_question_seconds: the question is killed and the node
// taken as usable, as when scontrol fails; the failed worker is replaced in place on its node.
TEST_CASE("slurm questions: no answer in time takes the node as usable") {
  FakeScontrol scontrol("MIXED+DRAIN");
  SlurmJob* h = nullptr;
  SlurmJob job(
      [&](FakeProcess& p) {
        p.print(agent_line("dtrain-agent", R"({"event":"started","pid":42})"));
        p.print(watch_event('S'));
        if (h->spawner.processes.size() == 5) {  // the replacement: enough
          boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
          return;
        }
        if (task_of(p) != "worker:3") return;
        boost::asio::post(*p.io, [&] {
          h->process(3).print(agent_line("dtrain-agent", R"({"event":"exit","code":1})"));
          h->process(3).end(ExitStatus::exited(1));
        });
      },
      0.5);
  h = &job;
  auto r = job.run(30);
  INFO(job.events());
  CHECK(r.status == "stopped");
  CHECK(scontrol.asked() == "n2\n");
  std::string events = job.events();
  CHECK(events.find(R"("event":"shrink")") == std::string::npos);
  CHECK(events.find(R"("event":"in_place","task":"worker:3",)") != std::string::npos);
  REQUIRE(job.spawner.processes.size() == 5);
  CHECK(task_of(job.process(4)) == "worker:3");
}
