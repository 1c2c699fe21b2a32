// The launcher's half of recovery in place (docs/design.md#in-place-recovery) against the fake
// spawner: a failed worker is replaced while the others run, reform requests are answered with
// the new generation (at once, or once the failure comes), and every case the rule excludes
// (no failure to explain a request, the budget spent, exit 2, nobody left, "recovery":
// "restart", command jobs) takes the whole-group path.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>

#include "common/atomic_file.h"
#include "common/control_protocol.h"
#include "common/exit_codes.h"
#include "common/job_spec.h"
#include "common/run_dir.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/plan/launch_plan.h"
#include "launcher/plan/worker_env.h"
#include "launcher/supervisor/supervisor.h"
#include "test/launcher/fake_spawner.h"
#include "test/launcher/supervisor_harness.h"
#include "test/support/temp_dir.h"
#include "test/support/train_section.h"

using namespace dtrain;
using launcher::ExitStatus;
using testing::FakeProcess;

namespace {

// A dtrain-worker job of three local workers (or a command job), fast timers.
std::string job_json(const std::string& extra, bool command, int max_restarts) {
  return std::string(R"({"job": "fake", "workers": 3, )") +
         (command ? R"("command": ["fake"])" : R"("train": {})") +
         R"(, "restart": {"max_restarts": )" + std::to_string(max_restarts) +
         R"(, "grace_seconds": 0.2, "startup_seconds": 0,
             "max_preemptions": 5, "backoff_seconds": 0.01, "backoff_max_seconds": 0.05})" +
         extra + "}";
}

struct Harness : testing::SupervisorHarness {
  Harness(const std::string& extra, testing::FakeSpawner::Script script, bool command = false,
          int max_restarts = 2, std::function<void(common::RestartPolicy&)> restart = {})
      : SupervisorHarness(
            job_json(extra, command, max_restarts), std::move(script),
            {std::move(restart),
             {},
             [](launcher::LaunchContext& c) { c.worker_program = "/fake/dtrain-worker"; },
             {},
             [](launcher::SupervisorOptions& o) { o.reform_hold_seconds = 0.3; }}) {}
  /// Sends worker task's reform request of generation; its replies land in replies[task].
  void reform(const std::string& task, int generation, int64_t whole_step = 20,
              bool in_flight = true) {
    common::ReformRequest request{task,       0,         generation,
                                  whole_step, in_flight, "worker:1 (rank 1): connection closed"};
    std::string json = common::format_reform_request(request);
    supervisor->on_reform_request(
        json.substr(0, json.size() - 1),
        [this, task](const std::string& line) { replies[task].push_back(line); });
  }
  void control(const std::string& json) {
    auto message = common::parse_control_message(json);
    REQUIRE(message);
    supervisor->on_control_message(*message);
  }

  std::map<std::string, std::vector<std::string>> replies;
};

int index_of(const FakeProcess& p) {
  std::string tf = p.env("TF_CONFIG");
  return std::stoi(tf.substr(tf.find("\"index\": ") + 9));
}
int generation_of(const FakeProcess& p) {
  return std::stoi(p.env("DTRAIN_GENERATION"));
}
bool has_env(const FakeProcess& p, const std::string& name) {
  for (const auto& kv : p.request.env)
    if (kv.first == name) return true;
  return false;
}

const std::string kOkGeneration1 = R"({"request":"reform","ok":true,"generation":1})"
                                   "\n";

}  // namespace

TEST_CASE("in place: a SIGKILLed worker is replaced while the others run on") {
  Harness* h = nullptr;
  std::vector<int> signals_seen_by_survivors;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 0 && index_of(p) == 1) return p.end(ExitStatus::killed(SIGKILL));
    if (generation_of(p) == 0) return;  // worker:0 and worker:2 run until stopped
    boost::asio::post(*p.io, [&] {      // the replacement runs: the survivors were left alone
      for (size_t i : {0, 2})
        for (int sig : h->spawner.processes[i]->signals) signals_seen_by_survivors.push_back(sig);
      h->reform("worker:0", 0);
      h->supervisor->stop(SIGTERM);
    });
  });
  h = &harness;
  CHECK(harness.in_place);
  auto r = harness.run();
  CHECK(r.status == "stopped");
  REQUIRE(harness.spawner.processes.size() == 4);
  const FakeProcess& replacement = *harness.spawner.processes[3];
  CHECK(index_of(replacement) == 1);
  CHECK(replacement.env("DTRAIN_GENERATION") == "1");
  CHECK(replacement.env("DTRAIN_ATTEMPT") == "0");
  CHECK(replacement.env("DTRAIN_RECOVERY") == "in_place");
  CHECK(harness.spawner.processes[0]->env("DTRAIN_GENERATION") == "0");
  CHECK(signals_seen_by_survivors.empty());
  CHECK(harness.replies["worker:0"] == std::vector<std::string>{kOkGeneration1});
  CHECK(harness.supervisor->book().preemptions() == 1);  // the budget pays for it
  CHECK(harness.supervisor->attempt() == 0);
  CHECK(
      harness.events().find(R"("event":"in_place","task":"worker:1","attempt":0,)"
                            R"("generation":1,"outcome":"preempted","what":"killed by SIGKILL")") !=
      std::string::npos);
  std::string log = common::read_file(harness.run_dir.log_file({"worker", 1}));
  CHECK(log.find("==== dtrain: attempt 0 of worker:1 (pid 1001) started") != std::string::npos);
  CHECK(log.find(", generation 1) started ") != std::string::npos);
  CHECK(harness.state().find("\"generation\":1") != std::string::npos);
}

// The notice (docs/design.md#in-place-recovery) goes to the survivors whose progress record
// shows they run dtrain-worker's loop, with the new generation; never to the failed one.
TEST_CASE("in place: the survivors get the notice of the new generation") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 1) {
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      return;
    }
    if (index_of(p) == 0) p.seen.record = common::ProgressSample{p.pid, 0, 5, 5, 2, 0.01};
    if (index_of(p) != 2) return;
    boost::asio::post(*p.io, [&] { h->spawner.processes[1]->end(ExitStatus::killed(SIGKILL)); });
  });
  h = &harness;
  auto r = harness.run();
  CHECK(r.status == "stopped");
  REQUIRE(harness.spawner.processes.size() == 4);
  CHECK(harness.spawner.processes[0]->queued == std::vector<std::pair<int, int>>{{SIGUSR1, 1}});
  CHECK(harness.spawner.processes[1]->queued.empty());  // the failed one
  CHECK(harness.spawner.processes[2]->queued.empty());  // no record yet: SIGUSR1 could kill it
}

// Over ssh: the request comes as the agent's marker line, the answer goes back on its stdin
// with the request's id, and the notice goes through the agent to the remote worker, which its
// agent's watch events show running dtrain-worker's loop.
TEST_CASE("in place: a remote worker re-forms through its agent") {
  testing::SupervisorHarness* h = nullptr;
  auto agent_line = [](const std::string& marker, const std::string& json) {
    return "\x1e" + marker + " " + json + "\n";
  };
  testing::SupervisorHarness harness(
      R"({"job": "fake", "cluster": {"worker": ["localhost:1", "192.0.2.1:2"]}, "train": {},
          "restart": {"max_restarts": 2, "grace_seconds": 0.2, "startup_seconds": 0,
                      "backoff_seconds": 0.01}})",
      [&](FakeProcess& p) {
        if (!p.request.agent()) {
          if (generation_of(p) == 1)
            boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
          return;
        }
        p.print(agent_line("dtrain-agent", R"({"event":"started","pid":42})"));
        p.print(agent_line("dtrain-agent",
                           R"({"event":"watch","state":"S","cpu_ticks":9,"record":{"pid":42,)"
                           R"("generation":0,"begun":7,"ended":7,"global_step":3,)"
                           R"("step_micros":20000}})"));
        boost::asio::post(*p.io, [&, remote = &p] {
          h->spawner.processes[0]->end(ExitStatus::killed(SIGKILL));
          common::ReformRequest request{"worker:1", 0, 0, 3, false, "connection closed"};
          std::string json = common::format_reform_request(request);
          remote->print(agent_line("dtrain-request", "7 " + json.substr(0, json.size() - 1)));
        });
      },
      {{},
       {},
       [](launcher::LaunchContext& c) { c.worker_program = "/fake/dtrain-worker"; },
       {},
       [](launcher::SupervisorOptions& o) { o.reform_hold_seconds = 0.3; }});
  h = &harness;
  REQUIRE(harness.in_place);
  auto r = harness.run();
  CHECK(r.status == "stopped");
  REQUIRE(harness.spawner.processes.size() == 3);
  const FakeProcess& remote = *harness.spawner.processes[1];
  CHECK(remote.env("DTRAIN_PROGRESS_FILE") == launcher::kAgentProgressPath);
  CHECK(remote.queued == std::vector<std::pair<int, int>>{{SIGUSR1, 1}});
  CHECK(remote.agent_input.find(launcher::format_agent_reply_command(7, kOkGeneration1)) !=
        std::string::npos);
  CHECK(generation_of(*harness.spawner.processes[2]) == 1);
  CHECK(harness.spawner.processes[2]->env("DTRAIN_RECOVERY") == "in_place");
}

TEST_CASE("in place: a reform request that comes before the failure waits for it") {
  Harness* h = nullptr;
  std::vector<std::string> before_failure;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 1) {
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      return;
    }
    if (index_of(p) != 2) return;
    boost::asio::post(*p.io, [&] {  // every worker of generation 0 runs
      h->reform("worker:0", 0);
      before_failure = h->replies["worker:0"];
      h->spawner.processes[1]->end(ExitStatus::exited(1));
    });
  });
  h = &harness;
  auto r = harness.run();
  CHECK(before_failure.empty());
  CHECK(harness.replies["worker:0"] == std::vector<std::string>{kOkGeneration1});
  REQUIRE(harness.spawner.processes.size() == 4);
  CHECK(generation_of(*harness.spawner.processes[3]) == 1);
  CHECK(harness.supervisor->book().restarts() == 1);
  CHECK(r.status == "stopped");
}

TEST_CASE("in place: a request that no failure explains in time tears the group down") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (p.attempt() == 1) return p.end(ExitStatus::exited(0));
    if (index_of(p) == 2) boost::asio::post(*p.io, [&] { h->reform("worker:0", 0); });
  });
  h = &harness;
  auto r = harness.run();
  CHECK(r.status == "succeeded");
  CHECK(harness.supervisor->attempt() == 1);
  CHECK(harness.supervisor->book().restarts() == 1);
  REQUIRE(harness.replies["worker:0"].size() == 1);
  const std::string reason =
      "worker:0 lost its group (worker:1 (rank 1): connection closed) but no task failed";
  std::optional<common::ReformReply> reply =
      common::parse_reform_reply(harness.replies["worker:0"][0]);
  REQUIRE(reply);
  CHECK_FALSE(reply->ok);
  CHECK(reply->error.find(reason) != std::string::npos);
  CHECK(harness.events().find(R"("event":"teardown","attempt":0,"reason":")" + reason) !=
        std::string::npos);
  CHECK_FALSE(harness.has_event("in_place"));
}

// The rule against crash loops counts the group's progress in place: replacements SIGKILLed
// before their own first report, while the survivors step on in between, are no OOM loop; with
// no step in between, the second such end takes the whole-group path as before.
TEST_CASE("in place: quick kills of replacements while the group steps on stay in place") {
  for (bool group_steps : {true, false}) {
    INFO("the group steps on between the kills: " << group_steps);
    Harness* h = nullptr;
    int kills = 0;
    Harness harness("", [&](FakeProcess& p) {
      if (index_of(p) != 1) return;
      if (generation_of(p) >= 2) {
        boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
        return;
      }
      boost::asio::post(*p.io, [&, process = &p] {
        if (group_steps) {
          int step = 10 * (++kills);
          h->control(R"({"type":"progress","task":"worker:0","attempt":0,"epoch":1,"epochs":2,)"
                     R"("step":)" +
                     std::to_string(step) + R"(,"steps":50,"global_step":)" + std::to_string(step) +
                     "}");
        }
        process->end(ExitStatus::killed(SIGKILL));
      });
    });
    h = &harness;
    auto r = harness.run();
    std::string events = harness.events();
    size_t first_restart = events.find(R"("event":"restart")");
    if (group_steps) {
      CHECK(r.status == "stopped");
      CHECK(events.find(R"("event":"in_place","task":"worker:1","attempt":0,"generation":2)") !=
            std::string::npos);
      CHECK(first_restart == std::string::npos);
    } else {  // the second quick SIGKILL of attempt 0 restarts the whole group
      REQUIRE(first_restart != std::string::npos);
      CHECK(events.find(R"("event":"in_place","task":"worker:1","attempt":0,"generation":2)") ==
            std::string::npos);
    }
  }
}

// Several faults while the group is stalled are no crash loop: different tasks killed in a row
// with no progress between them are each replaced in place.
TEST_CASE("in place: different tasks killed in a row before any progress stay in place") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 2) {
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      return;
    }
    if (generation_of(p) == 0 && index_of(p) == 2)  // all three run: two die at once
      boost::asio::post(*p.io, [&] {
        h->spawner.processes[0]->end(ExitStatus::killed(SIGKILL));
        h->spawner.processes[1]->end(ExitStatus::killed(SIGKILL));
      });
  });
  h = &harness;
  auto r = harness.run();
  CHECK(r.status == "stopped");
  std::string events = harness.events();
  CHECK(events.find(R"("event":"in_place","task":"worker:0","attempt":0,"generation":1)") !=
        std::string::npos);
  CHECK(events.find(R"("event":"in_place","task":"worker:1","attempt":0,"generation":2)") !=
        std::string::npos);
  CHECK(events.find(R"("event":"restart")") == std::string::npos);
}

TEST_CASE("in place: a spent restart budget takes the whole-group path") {
  Harness harness(
      "",
      [](FakeProcess& p) {
        if (index_of(p) == 1) p.end(ExitStatus::exited(1));
      },
      false, 0);
  auto r = harness.run();
  CHECK(r.status == "failed");
  CHECK(r.exit_code == 1);
  CHECK(r.reason.find("restart budget") != std::string::npos);
  CHECK(harness.spawner.processes.size() == 3);
  CHECK(harness.spawner.processes[0]->signals == std::vector<int>{SIGTERM});
  CHECK_FALSE(harness.has_event("in_place"));
  CHECK(harness.has_event("teardown"));
}

TEST_CASE("in place: a configuration error (exit 2) still ends the job with exit 2") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    // the request is held first, then worker:1's end comes
    if (index_of(p) == 0) boost::asio::post(*p.io, [&] { h->reform("worker:0", 0); });
    if (index_of(p) == 1) p.end(ExitStatus::exited(2));
  });
  h = &harness;
  auto r = harness.run();
  CHECK(r.status == "failed");
  CHECK(r.exit_code == 2);
  REQUIRE(r.failure);
  CHECK(r.failure->outcome == launcher::Outcome::kConfigError);
  CHECK(harness.spawner.processes.size() == 3);
  CHECK_FALSE(harness.has_event("in_place"));
  // Any teardown refuses what is held.
  REQUIRE(harness.replies["worker:0"].size() == 1);
  auto reply = common::parse_reform_reply(harness.replies["worker:0"][0]);
  REQUIRE(reply);
  CHECK_FALSE(reply->ok);
  CHECK(reply->error.find("being stopped") != std::string::npos);
}

TEST_CASE("in place: with no other training task running, the group restarts") {
  Harness harness("", [](FakeProcess& p) {
    if (p.attempt() == 1 || index_of(p) != 1) return p.end(ExitStatus::exited(0));
    // worker:1 fails after worker:0 and worker:2 have finished
    boost::asio::post(*p.io, [&p] { p.end(ExitStatus::exited(1)); });
  });
  auto r = harness.run();
  CHECK(r.status == "succeeded");
  CHECK(harness.supervisor->attempt() == 1);
  CHECK(harness.supervisor->book().restarts() == 1);
  CHECK(harness.spawner.processes.size() == 6);
  CHECK_FALSE(harness.has_event("in_place"));
}

TEST_CASE("\"recovery\": \"restart\" and command jobs restart the group, without DTRAIN_RECOVERY") {
  bool command = GENERATE(false, true);
  INFO("command job: " << command);
  Harness harness(
      command ? "" : R"(, "recovery": "restart")",
      [](FakeProcess& p) {
        if (p.attempt() == 1) return p.end(ExitStatus::exited(0));
        if (index_of(p) == 1) p.end(ExitStatus::killed(SIGKILL));
      },
      command);
  CHECK_FALSE(harness.in_place);
  auto r = harness.run();
  CHECK(r.status == "succeeded");
  CHECK(harness.supervisor->attempt() == 1);
  CHECK(harness.supervisor->book().preemptions() == 1);
  REQUIRE(harness.spawner.processes.size() == 6);
  CHECK(harness.spawner.processes[0]->signals == std::vector<int>{SIGTERM});
  for (const auto& p : harness.spawner.processes) {
    CHECK_FALSE(has_env(*p, "DTRAIN_RECOVERY"));
    CHECK(p->env("DTRAIN_GENERATION") == "0");
  }
  CHECK_FALSE(harness.has_event("in_place"));
}

TEST_CASE("in place: the new generation's first step past restored_step is its recovery") {
  Harness* h = nullptr;
  std::string recovered_too_early;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 0 && index_of(p) == 1) {
      boost::asio::post(*p.io, [&] {
        h->control(R"({"type":"progress","task":"worker:0","attempt":0,"global_step":30})");
        h->spawner.processes[1]->end(ExitStatus::exited(1));
      });
    }
    if (generation_of(p) != 1) return;
    boost::asio::post(*p.io, [&] {
      h->control(R"({"type":"heartbeat","task":"worker:0","attempt":0,"generation":1,)"
                 R"("restored_step":20})");
      h->control(R"({"type":"progress","task":"worker:0","attempt":0,"generation":1,)"
                 R"("global_step":20})");
      recovered_too_early = h->has_event("recovered") ? "yes" : "no";
      h->control(R"({"type":"progress","task":"worker:0","attempt":0,"generation":1,)"
                 R"("global_step":21})");
      h->supervisor->stop(SIGTERM);
    });
  });
  h = &harness;
  auto r = harness.run();
  CHECK(recovered_too_early == "no");
  REQUIRE(r.recoveries.size() == 1);
  CHECK(r.recoveries[0].in_place);
  CHECK(r.recoveries[0].generation == 1);
  CHECK(r.recoveries[0].restored_step == 20);
  CHECK(r.recoveries[0].steps_redone() == 10);
  CHECK(r.recoveries[0].seconds >= 0);
  CHECK(
      harness.events().find(R"("event":"recovered","attempt":0,"path":"in_place",)"
                            R"("generation":1,"restored_step":20,"steps_redone":10,"seconds":)") !=
      std::string::npos);
  CHECK(harness.state().find("\"in_place_recoveries\":1") != std::string::npos);
  CHECK(harness.state().find("\"steps_redone\":10") != std::string::npos);
}

TEST_CASE("in place: the env of an in-place launch, and of its evaluator") {
  common::JobSpec spec = common::parse_job_spec(
      R"({"job": "e", "cluster": {"worker": ["localhost:1", "localhost:2"],
          "evaluator": ["localhost:3"]}, "train": {}})",
      "job.json");
  launcher::LaunchContext c;
  c.spec = &spec;
  c.cluster = spec.cluster;
  c.run_dir = "/abs/run";
  launcher::LaunchPlan plan = launcher::plan_launch(c);
  REQUIRE(plan.in_place);
  CHECK(plan.recovery_note.empty());
  auto env_of = [&](const common::TaskId& task, int generation) {
    std::map<std::string, std::string> env;
    for (auto& kv : launcher::make_spawn_request(plan, plan.task(task), {2, 0, {}, generation}).env)
      env.insert(kv);
    return env;
  };
  auto worker = env_of({"worker", 1}, 3);
  CHECK(worker["DTRAIN_GENERATION"] == "3");
  CHECK(worker["DTRAIN_ATTEMPT"] == "2");
  CHECK(worker["DTRAIN_RECOVERY"] == "in_place");
  auto evaluator = env_of({"evaluator", 0}, 0);
  CHECK(evaluator["DTRAIN_GENERATION"] == "0");
  CHECK(evaluator.count("DTRAIN_RECOVERY") == 0);
}

// A remote task re-forms as a local one does: its agent relays the requests and keeps its
// progress record. Other hosts' GPUs are not seen: a device other than cpu or auto restarts.
TEST_CASE("in place: remote training tasks re-form; their agents keep the progress records") {
  common::JobSpec spec = common::parse_job_spec(
      R"({"job": "e", "cluster": {"worker": ["localhost:1", "192.0.2.7:2"]}, "train": {}})",
      "job.json");
  launcher::LaunchContext c;
  c.spec = &spec;
  c.cluster = spec.cluster;
  c.run_dir = "/abs/run";
  launcher::LaunchPlan plan = launcher::plan_launch(c);
  CHECK(plan.in_place);
  CHECK(plan.recovery_note.empty());
  CHECK(plan.tasks.at(0).progress_path == "/abs/run/progress/worker-0");
  CHECK(plan.tasks.at(1).progress_path == launcher::kAgentProgressPath);

  common::JobSpec cuda = common::parse_job_spec(
      R"({"job": "e", "cluster": {"worker": ["localhost:1", "192.0.2.7:2"]}, "train": )" +
          testing::train_with(R"(, "device": "cuda")") + "}",
      "job.json");
  c.spec = &cuda;
  launcher::LaunchPlan gpu = launcher::plan_launch(c);
  CHECK_FALSE(gpu.in_place);
  CHECK(gpu.recovery_note ==
        "recovery: restart (GPU workers on other hosts are not yet recovered in place)");
}

// Whole steps are kept on hosts and on GPUs staged through the host (worker/train/train_step.h):
// GPU workers that share GPUs here (the ring staged through host memory) re-form, as do those
// told "ring"; those that may get NCCL restart and say why.
TEST_CASE("in place: GPU workers re-form over a host-staged ring; NCCL ones restart, saying why") {
  struct Case {
    const char* train;
    int local_gpus;
    bool in_place;
  };
  for (Case k : {Case{"", 1, true}, Case{R"(, "device": "cuda")", 1, true},
                 Case{R"(, "device": "cpu")", 2, true}, Case{"", 2, false},
                 Case{R"(, "device": "cuda", "communication": "nccl")", 1, false},
                 Case{R"(, "communication": "ring")", 2, true}}) {
    INFO("train: {" << k.train << "}, " << k.local_gpus << " GPU(s)");
    common::JobSpec spec = common::parse_job_spec(
        std::string(R"({"job": "g", "workers": 2, "gpu_sharing": true, "train": )") +
            testing::train_with(k.train) + "}",
        "job.json");
    launcher::LaunchContext c;
    c.spec = &spec;
    c.cluster = common::resolve_cluster(spec);
    c.run_dir = "/abs/run";
    c.local_gpus = k.local_gpus;
    launcher::LaunchPlan plan = launcher::plan_launch(c);
    CHECK(plan.in_place == k.in_place);
    CHECK(plan.recovery_note.empty() == k.in_place);
    if (!k.in_place) {
      CHECK(plan.recovery_note.find("recovery: restart (train.communication \"") == 0);
      CHECK(plan.recovery_note.find("set \"ring\" for recovery in place on GPUs") !=
            std::string::npos);
    }
  }
}

TEST_CASE("in place: reform requests the supervisor cannot hold are answered at once") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (index_of(p) != 2) return;
    boost::asio::post(*p.io, [&] {
      h->reform("worker:0", 5);  // never formed
      h->reform("evaluator:0", 0);
      h->supervisor->on_reform_request(R"({"request":"reform"})", [&](const std::string& line) {
        h->replies["malformed"].push_back(line);
      });
      h->supervisor->stop(SIGTERM);
    });
  });
  h = &harness;
  harness.run();
  for (const char* who : {"worker:0", "evaluator:0", "malformed"}) {
    INFO(who);
    REQUIRE(harness.replies[who].size() == 1);
    auto reply = common::parse_reform_reply(harness.replies[who][0]);
    REQUIRE(reply);
    CHECK_FALSE(reply->ok);
  }
  CHECK(harness.replies["worker:0"][0].find("never formed") != std::string::npos);
}

TEST_CASE("in place: a dead worker's output held open delays its replacement only so long") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 1) {
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      return;
    }
    if (index_of(p) != 1) return;
    boost::asio::post(*p.io, [&p] {  // it exits; a grandchild outside its group keeps the pipe
      p.ended = true;
      p.callbacks.on_exit(ExitStatus::exited(1));
    });
  });
  h = &harness;
  auto r = harness.run();
  CHECK(r.status == "stopped");
  REQUIRE(harness.spawner.processes.size() == 4);
  CHECK(generation_of(*harness.spawner.processes[3]) == 1);
  CHECK(harness.spawner.processes[1]->signals == std::vector<int>{SIGKILL});
  CHECK(harness.spawner.processes[0]->signals == std::vector<int>{SIGTERM});  // from the stop
}

// The survivors' reform requests say what they held (whole_step 20, a step in flight): the group
// redoes one step, whatever an older report of step 30 said.
TEST_CASE("in place: the steps redone are counted from what the survivors held") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 0 && index_of(p) == 1) {
      boost::asio::post(*p.io, [&] {
        h->control(R"({"type":"progress","task":"worker:0","attempt":0,"global_step":30})");
        h->reform("worker:0", 0);  // held: whole_step 20, in flight
        h->spawner.processes[1]->end(ExitStatus::exited(1));
      });
    }
    if (generation_of(p) != 1) return;
    boost::asio::post(*p.io, [&] {
      h->control(R"({"type":"heartbeat","task":"worker:0","attempt":0,"generation":1,)"
                 R"("restored_step":20})");
      h->control(R"({"type":"progress","task":"worker:0","attempt":0,"generation":1,)"
                 R"("global_step":21})");
      h->supervisor->stop(SIGTERM);
    });
  });
  h = &harness;
  auto r = harness.run();
  REQUIRE(r.recoveries.size() == 1);
  CHECK(r.recoveries[0].restored_step == 20);
  CHECK(r.recoveries[0].steps_redone() == 1);
}

// Exit 143 is a worker's end after the group agreed to stop and saved (a stop from its parent):
// the others end so too, and the group restarts from that checkpoint; no replacement.
TEST_CASE("in place: exit 143 (the group's agreed stop) takes the whole-group path") {
  Harness harness("", [](FakeProcess& p) {
    if (p.attempt() == 1) return p.end(ExitStatus::exited(0));
    if (index_of(p) == 1)
      boost::asio::post(*p.io, [&p] { p.end(ExitStatus::exited(common::kExitPreempted)); });
  });
  auto r = harness.run();
  CHECK(r.status == "succeeded");
  CHECK(harness.supervisor->attempt() == 1);
  CHECK_FALSE(harness.has_event("in_place"));
  CHECK(harness.spawner.processes.size() == 6);
}

// Issue 43, item 3: a member that finishes (exit 0) joins no re-formation. When it ends while
// a failed task is being replaced (the chief failed at its final save), the whole group
// restarts at once, blamed on that failure; when it has ended before the failure, nothing is
// replaced in place. Before, the replacement waited out its rendezvous and the reform hold.
TEST_CASE("in place: a member that finished makes the whole group restart at once") {
  for (bool finished_first : {false, true}) {
    INFO("the member finished before the failure: " << finished_first);
    Harness* h = nullptr;
    Harness harness("", [&](FakeProcess& p) {
      if (p.attempt() == 1) return p.end(ExitStatus::exited(0));
      if (generation_of(p) == 1) {  // the replacement waits for a group that cannot form
        boost::asio::post(*p.io, [&] { h->spawner.processes[1]->end(ExitStatus::exited(0)); });
        return;
      }
      if (index_of(p) != 2) return;
      boost::asio::post(*p.io, [&] {  // every worker of generation 0 runs
        if (finished_first) h->spawner.processes[1]->end(ExitStatus::exited(0));
        boost::asio::post(*h->spawner.processes[0]->io,
                          [&] { h->spawner.processes[0]->end(ExitStatus::exited(1)); });
      });
    });
    h = &harness;
    auto r = harness.run(5);
    CHECK(r.status == "succeeded");
    CHECK(harness.supervisor->attempt() == 1);
    REQUIRE(r.failure == std::nullopt);
    std::string events = harness.events();
    CHECK(events.find(R"("event":"restart","attempt":1,"delay_seconds")") != std::string::npos);
    CHECK(events.find(R"("after":"failed")") != std::string::npos);
    if (finished_first) {
      CHECK_FALSE(harness.has_event("in_place"));
      CHECK(harness.spawner.processes.size() == 6);
    } else {
      CHECK(events.find(R"("event":"in_place","task":"worker:0")") != std::string::npos);
      CHECK(events.find(R"("reason":"worker:1 finished while worker:0 was being replaced")") !=
            std::string::npos);
      CHECK(harness.spawner.processes.size() == 7);
    }
  }
}

// The other side of item 3: members that re-formed (told to join the new generation) and then
// finished did so with the group (a failure at the very end, nothing left to train): the job
// succeeds in place, with no restart.
TEST_CASE("in place: members that re-formed and then finished end the job in place") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (p.attempt() == 1) return p.end(ExitStatus::exited(0));
    if (generation_of(p) == 0 && index_of(p) == 1)
      return boost::asio::post(*p.io, [&p] { p.end(ExitStatus::exited(1)); });
    if (generation_of(p) != 1) return;
    boost::asio::post(*p.io, [&, replacement = &p] {
      h->reform("worker:0", 0);
      h->reform("worker:2", 0);
      h->spawner.processes[0]->end(ExitStatus::exited(0));
      h->spawner.processes[2]->end(ExitStatus::exited(0));
      replacement->end(ExitStatus::exited(0));
    });
  });
  h = &harness;
  auto r = harness.run(5);
  CHECK(r.status == "succeeded");
  CHECK(harness.supervisor->attempt() == 0);
  CHECK_FALSE(harness.has_event("restart"));
  CHECK(harness.replies["worker:2"] == std::vector<std::string>{kOkGeneration1});
}

// Issue 43, item 17: survivors waiting for a slow replacement send no heartbeat; the hang
// watchdog leaves the members of a pending re-formation alone, and watches them again once the
// new generation has stepped.
TEST_CASE("in place: the hang watchdog spares members waiting in a re-formation") {
  Harness* h = nullptr;
  Harness harness(R"(, "hang_timeout_seconds": 0.5)",
                  [&](FakeProcess& p) {
                    if (p.attempt() == 1) return p.end(ExitStatus::exited(0));
                    if (generation_of(p) == 0 && index_of(p) == 1)
                      return p.end(ExitStatus::killed(SIGKILL));
                    if (generation_of(p) != 1) return;
                    // The replacement takes 1.5 s (three hang time-outs) to start; the group then
                    // steps once and falls silent, a hang of the whole group.
                    p.after(1.5, [&] {
                      CHECK_FALSE(h->has_event("hang"));
                      for (const char* task : {"worker:0", "worker:1", "worker:2"}) {
                        h->control(std::string(R"({"type":"heartbeat","task":")") + task +
                                   R"(","attempt":0,"generation":1,"restored_step":0})");
                        h->control(std::string(R"({"type":"progress","task":")") + task +
                                   R"(","attempt":0,"generation":1,"global_step":1})");
                      }
                    });
                  },
                  false, 2, [](common::RestartPolicy& r) { r.startup_seconds = 5; });
  h = &harness;
  auto r = harness.run(10);
  CHECK(r.status == "succeeded");
  CHECK(harness.supervisor->attempt() == 1);
  std::string events = harness.events();
  size_t recovered = events.find(R"("event":"recovered","attempt":0,"path":"in_place")");
  size_t hang = events.find(R"("event":"hang")");
  REQUIRE(recovered != std::string::npos);
  REQUIRE(hang != std::string::npos);
  CHECK(recovered < hang);
}

// Issue 43, item 16: a replacement on a host that was lost backs off exponentially, as the
// whole-group path does, instead of spending the budget at once (or ending in place after two
// start failures); the outage is ridden out in place.
TEST_CASE("in place: replacements on a lost host back off and ride out the outage") {
  testing::SupervisorHarness* h = nullptr;
  auto agent = [](const std::string& json) {
    return "\x1e"
           "dtrain-agent " +
           json + "\n";
  };
  testing::SupervisorHarness harness(
      R"({"job": "fake", "cluster": {"worker": ["localhost:1", "192.0.2.1:2"]}, "train": {},
          "restart": {"max_restarts": 5, "grace_seconds": 0.2, "startup_seconds": 0,
                      "backoff_seconds": 0.02, "backoff_max_seconds": 1}})",
      [&](FakeProcess& p) {
        if (!p.request.agent()) return;  // worker:0 runs on
        int generation = generation_of(p);
        if (generation == 0) {  // trains, then its host is cut: the session ends unreported
          p.print(agent(R"({"event":"started","pid":42})"));
          return p.end(ExitStatus::exited(255));
        }
        if (generation < 4) {  // still cut: ssh cannot reach the host
          p.print("ssh: connect to host 192.0.2.1 port 22: No route to host\r\n");
          return p.end(ExitStatus::exited(255));
        }
        p.print(agent(R"({"event":"started","pid":43})"));  // the host is back
        boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      },
      {{},
       {},
       [](launcher::LaunchContext& c) { c.worker_program = "/fake/dtrain-worker"; },
       {},
       [](launcher::SupervisorOptions& o) { o.reform_hold_seconds = 0.3; }});
  h = &harness;
  REQUIRE(harness.in_place);
  auto r = harness.run(10);
  CHECK(r.status == "stopped");
  std::string events = harness.events();
  CHECK(events.find(R"("event":"restart")") == std::string::npos);
  CHECK(events.find("was lost earlier and is still unreachable") != std::string::npos);
  std::vector<double> delays;
  for (size_t at = events.find(R"("event":"in_place")"); at != std::string::npos;
       at = events.find(R"("event":"in_place")", at + 1)) {
    size_t key = events.find(R"("delay_seconds":)", at);
    REQUIRE(key < events.find('\n', at));
    delays.push_back(std::stod(events.substr(key + 16)));
  }
  REQUIRE(delays.size() == 4);
  for (size_t i = 1; i < delays.size(); ++i) CHECK(delays[i] > delays[i - 1]);  // doubling
  CHECK(harness.supervisor->book().restarts() == 4);
  REQUIRE(harness.spawner.processes.size() == 6);
  CHECK(generation_of(*harness.spawner.processes[5]) == 4);
}

// Issue 43, item 4: a survivor whose rendezvous for the new generation timed out while the
// replacement is still starting (a slow data load) is told to wait for that generation again,
// within restart.startup_seconds of the replacement's spawn; past it, its request is held as
// before (and the group torn down when no failure explains it).
TEST_CASE("in place: survivors wait again for a replacement still starting") {
  for (double startup : {30.0, 0.0}) {
    INFO("startup_seconds " << startup);
    Harness* h = nullptr;
    std::vector<std::string> replies_at_once;
    Harness harness(
        "",
        [&](FakeProcess& p) {
          if (generation_of(p) == 0 && index_of(p) == 1) return p.end(ExitStatus::killed(SIGKILL));
          if (generation_of(p) != 1) return;
          boost::asio::post(*p.io, [&] {  // the replacement loads its data meanwhile
            h->reform("worker:0", 0);
            h->reform("worker:0", 1);  // its rendezvous for generation 1 timed out
            replies_at_once = h->replies["worker:0"];
            h->supervisor->stop(SIGTERM);
          });
        },
        false, 2, [startup](common::RestartPolicy& r) { r.startup_seconds = startup; });
    h = &harness;
    auto r = harness.run(5);
    CHECK(r.status == "stopped");
    if (startup > 0) {
      CHECK(replies_at_once == std::vector<std::string>{kOkGeneration1, kOkGeneration1});
    } else {
      CHECK(replies_at_once == std::vector<std::string>{kOkGeneration1});
      REQUIRE(harness.replies["worker:0"].size() == 2);
      CHECK(harness.replies["worker:0"][1].find("being stopped") != std::string::npos);
    }
  }
}

// Issue 43, item 8: every worker killed at once, each replaced in place: the new generation
// restores the newest checkpoint (step 400) after step 600 was reached. A fresh replacement's
// request holds no state; the steps redone count from the furthest step reported.
TEST_CASE("in place: steps redone after every worker was replaced count from the step reached") {
  Harness* h = nullptr;
  Harness harness("", [&](FakeProcess& p) {
    if (generation_of(p) == 0 && index_of(p) == 2) {
      boost::asio::post(*p.io, [&] {
        h->control(R"({"type":"progress","task":"worker:0","attempt":0,"global_step":600})");
        for (size_t i : {0, 1, 2}) h->spawner.processes[i]->end(ExitStatus::killed(SIGKILL));
      });
    }
    if (generation_of(p) != 3) return;
    boost::asio::post(*p.io, [&] {
      h->reform("worker:0", 1, 0, false);  // a replacement whose first group broke: no state
      h->control(R"({"type":"heartbeat","task":"worker:0","attempt":0,"generation":3,)"
                 R"("restored_step":400})");
      h->control(R"({"type":"progress","task":"worker:0","attempt":0,"generation":3,)"
                 R"("global_step":401})");
      h->supervisor->stop(SIGTERM);
    });
  });
  h = &harness;
  auto r = harness.run(5);
  REQUIRE(r.recoveries.size() == 1);
  CHECK(r.recoveries[0].in_place);
  CHECK(r.recoveries[0].restored_step == 400);
  CHECK(r.recoveries[0].steps_redone() == 200);
}
