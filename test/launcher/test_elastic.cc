// The launcher's half of elastic membership (docs/design.md#elastic-membership) against the fake
// spawner, remote tasks behind the real agent child: a host lost leaves the group (shrink), the
// survivors re-form with the members named, the host is tried again with back-off and its tasks
// join as spares of their own places (grow). What may not shrink (too few left, the chief's host,
// a local task) takes the in-place path. The workers' side (shards, sums) is test/comm's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <map>
#include <set>

#include "common/control_protocol.h"
#include "common/json.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/plan/launch_plan.h"
#include "launcher/view/group_view.h"
#include "test/launcher/fake_spawner.h"
#include "test/launcher/supervisor_harness.h"
#include "test/support/config_error.h"
#include "test/support/train_section.h"

using namespace dtrain;
using launcher::ExitStatus;
using testing::FakeProcess;
using testing::reform_reply;

namespace {

// Two hosts of two workers each; worker:0 (the chief) on the first. TEST-NET-2 addresses: a test
// machine may well have one of TEST-NET-1 (192.0.2.0/24) as its own.
const std::string kTwoHosts =
    R"(["198.51.100.1:1", "198.51.100.1:2", "198.51.100.2:1", "198.51.100.2:2"])";

std::string job_json(int min_workers, const std::string& workers) {
  return R"({"job": "elastic", "freeze_seconds": 2, "cluster": {"worker": )" + workers +
         R"(}, "train": {}, "elastic": {"min_workers": )" + std::to_string(min_workers) +
         R"(}, "restart": {"max_restarts": 3, "grace_seconds": 0.2, "startup_seconds": 0,
             "max_preemptions": 5, "backoff_seconds": 0.01, "backoff_max_seconds": 0.05}})";
}

std::string agent_line(const std::string& marker, const std::string& payload) {
  return "\x1e" + marker + " " + payload + "\n";
}
std::string started_event() {
  return agent_line("dtrain-agent", R"({"event":"started","pid":42})");
}
// The agent's watch event: dtrain-worker's loop runs (its record is the worker's, pid 42).
std::string watch_event() {
  return agent_line("dtrain-agent",
                    R"({"event":"watch","state":"S","cpu_ticks":9,"record":{"pid":42,)"
                    R"("generation":0,"begun":7,"ended":7,"global_step":3,"step_micros":20000}})");
}
std::string without_newline(std::string line) {
  if (!line.empty() && line.back() == '\n') line.pop_back();
  return line;
}
std::string reform_request(const std::string& task, int generation) {
  return without_newline(common::format_reform_request(
      {task, 0, generation, 20, true, "worker:2 (rank 2): connection closed"}));
}
std::string spare_request(const std::string& task) {
  return without_newline(common::format_spare_request({task, 42}));
}

// The task a process runs: a joiner's DTRAIN_SPARE, else its TF_CONFIG's.
std::string task_of(const FakeProcess& p) {
  if (std::string spare = p.env("DTRAIN_SPARE"); !spare.empty()) return spare;
  std::string tf = p.env("TF_CONFIG");
  return "worker:" + tf.substr(tf.find("\"index\": ") + 9, 1);
}
int generation_of(const FakeProcess& p) {
  return std::stoi(p.env("DTRAIN_GENERATION"));
}
bool has_env(const FakeProcess& p, const std::string& name) {
  std::string_view request(p.request.agent_request);
  request.remove_suffix(1);
  for (const auto& kv : launcher::parse_agent_request(request).env)
    if (kv.first == name) return true;
  return false;
}

// Each worker's state in a state.json text.
std::map<std::string, std::string> worker_states(const std::string& state_json) {
  std::map<std::string, std::string> states;
  common::JsonDocument doc = common::JsonDocument::parse(state_json, "state.json");
  for (const common::JsonNode& w : doc.root().at("workers").as_array())
    states[w.at("task").as_string()] = w.at("state").as_string();
  return states;
}
int world_size_in(const std::string& state_json) {
  common::JsonDocument doc = common::JsonDocument::parse(state_json, "state.json");
  return static_cast<int>(doc.root().at("world_size").as_int(0, 1000));
}

struct ElasticJob : testing::SupervisorHarness {
  ElasticJob(int min_workers, const std::string& workers, testing::FakeSpawner::Script script,
             double rejoin_first = 0.05, double rejoin_most = 1)
      : SupervisorHarness(
            job_json(min_workers, workers), std::move(script),
            {{},
             {},
             [](launcher::LaunchContext& c) { c.worker_program = "/fake/dtrain-worker"; },
             {},
             [=](launcher::SupervisorOptions& o) {
               o.reform_hold_seconds = 5;
               o.rejoin_first_seconds = rejoin_first;
               o.rejoin_most_seconds = rejoin_most;
             }}) {}

  FakeProcess& process(size_t i) { return *spawner.processes.at(i); }
  /// p's worker sends json through its agent, as request id.
  void relay(FakeProcess& p, uint64_t id, const std::string& json) {
    p.print(agent_line("dtrain-request", std::to_string(id) + " " + json));
  }
  /// The survivors (worker:0, worker:1) ask to re-form generation 0, then host 198.51.100.2's
  /// sessions end as ssh does when the host is cut off (255, after the worker started).
  void lose_second_host() {
    relay(process(0), 1, reform_request("worker:0", 0));
    relay(process(1), 1, reform_request("worker:1", 0));
    process(2).end(ExitStatus::exited(255));
    process(3).end(ExitStatus::exited(255));
  }
  std::vector<const FakeProcess*> joiners() const {
    std::vector<const FakeProcess*> found;
    for (const auto& p : spawner.processes)
      if (!p->env("DTRAIN_SPARE").empty()) found.push_back(p.get());
    return found;
  }
};

}  // namespace

TEST_CASE("elastic: a host lost leaves the group, which re-forms without it and grows back") {
  ElasticJob* h = nullptr;
  std::string state_after_shrink, prometheus_after_shrink;
  ElasticJob job(2, kTwoHosts, [&](FakeProcess& p) {
    p.print(started_event());
    p.print(watch_event());
    if (std::string joiner = p.env("DTRAIN_SPARE"); !joiner.empty()) {
      h->relay(p, 9, spare_request(joiner));  // warm: it asks to be let in
      if (joiner != "worker:3") return;
      boost::asio::post(*p.io, [&] {  // grown: a survivor's late request, then the end
        h->relay(h->process(0), 2, reform_request("worker:0", 1));
        h->after(0.05, [&] { h->supervisor->stop(SIGTERM); });
      });
      return;
    }
    if (task_of(p) != "worker:3") return;
    boost::asio::post(*p.io, [&] {  // all four run
      h->lose_second_host();
      boost::asio::post(*h->process(3).io, [&] {
        state_after_shrink = h->state();
        prometheus_after_shrink = launcher::prometheus_text(h->supervisor->snapshot());
      });
    });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.supervisor->attempt() == 0);
  CHECK(job.supervisor->book().restarts() == 0);  // leaving costs no restart budget
  CHECK(job.supervisor->book().preemptions() == 0);

  // The shrink: host 2's tasks away, the survivors told to re-form as generation 1 of "0,1".
  REQUIRE_FALSE(state_after_shrink.empty());
  auto states = worker_states(state_after_shrink);
  CHECK(states["worker:2"] == "away");
  CHECK(states["worker:3"] == "away");
  CHECK(states["worker:0"] == "running");
  CHECK(world_size_in(state_after_shrink) == 2);
  CHECK(prometheus_after_shrink.find("dtrain_world_size{job=\"elastic\"} 2\n") !=
        std::string::npos);
  std::string events = job.events();
  CHECK(events.find(R"("event":"shrink","attempt":0,"generation":1,"world_size":2,)"
                    R"("host":"198.51.100.2","tasks":["worker:2","worker:3"],"members":"0,1")") !=
        std::string::npos);
  CHECK(events.find(R"("event":"in_place")") == std::string::npos);
  for (size_t survivor : {0, 1}) {
    INFO("worker:" << survivor);
    std::vector<std::string> replies = job.process(survivor).replies();
    REQUIRE(replies.size() >= 1);
    common::ReformReply first = reform_reply(replies[0]);
    CHECK(first.ok);
    CHECK(first.generation == 1);
    CHECK(first.members == "0,1");
    CHECK(job.process(survivor).queued.at(0) == std::pair<int, int>{SIGUSR1, 1});
  }

  // The rejoin: both tasks of host 2 start as joiners, spares of their own places.
  auto joiners = job.joiners();
  REQUIRE(joiners.size() == 2);
  for (const FakeProcess* joiner : joiners) {
    std::string task = joiner->env("DTRAIN_SPARE");
    INFO(task);
    CHECK((task == "worker:2" || task == "worker:3"));
    CHECK(joiner->request.remote->name == "198.51.100.2");
    CHECK(has_env(*joiner, "DTRAIN_MEMBERS"));
    CHECK(joiner->env("DTRAIN_MEMBERS") == "0,1");
    CHECK_FALSE(has_env(*joiner, "TF_CONFIG"));  // it learns its place with the assignment
    std::vector<std::string> replies = joiner->replies();
    REQUIRE(replies.size() == 1);
    std::optional<common::SpareAssignment> assignment = common::parse_spare_assignment(replies[0]);
    REQUIRE(assignment);
    CHECK(assignment->ok);
    CHECK(assignment->task == task);
    CHECK(assignment->generation == 2);
    CHECK(assignment->members.empty());  // everyone
    CHECK(assignment->tf_config.find("\"index\": " + task.substr(7)) != std::string::npos);
  }
  for (size_t original = 0; original < 4; ++original) {
    CHECK(has_env(job.process(original), "DTRAIN_MEMBERS"));
    CHECK(job.process(original).env("DTRAIN_MEMBERS").empty());
  }

  // The growth: generation 2, everyone; the survivor that asked late re-forms into it.
  CHECK(events.find(R"("event":"grow","attempt":0,"generation":2,"world_size":4,)"
                    R"("host":"198.51.100.2",)") != std::string::npos);
  CHECK(events.find(R"("members":"all")") != std::string::npos);
  std::vector<std::string> replies = job.process(0).replies();
  REQUIRE(replies.size() == 2);
  common::ReformReply late = reform_reply(replies[1]);
  CHECK(late.ok);
  CHECK(late.generation == 2);
  CHECK(late.members.empty());
  CHECK(job.process(0).queued == std::vector<std::pair<int, int>>{{SIGUSR1, 1}, {SIGUSR1, 2}});
  std::string state = job.state();
  CHECK(world_size_in(state) == 4);
  CHECK(state.find(R"("membership":[{"at":")") != std::string::npos);
  common::JsonDocument doc = common::JsonDocument::parse(state, "state.json");
  auto points = doc.root().at("membership").as_array();
  REQUIRE(points.size() == 2);
  CHECK(points[0].at("world_size").as_int(0, 9) == 2);
  CHECK(points[1].at("world_size").as_int(0, 9) == 4);
  CHECK(points[1].at("generation").as_int(0, 9) == 2);
}

// The other two ways a host is gone: its workers never started there (the remote shell could not
// reach it), or its agents went quiet while the others are heard (the freeze watch's "no word
// from it", confirmed at 1.5 x the jobs' freeze_seconds of 2).
TEST_CASE("elastic: a host whose workers never started, or whose agents went quiet, is left") {
  bool quiet = GENERATE(false, true);
  INFO((quiet ? "quiet agents" : "never started"));
  ElasticJob* h = nullptr;
  std::function<void(FakeProcess&)> keep_talking = [&](FakeProcess& p) {
    if (p.ended) return;
    p.print(watch_event());
    h->after(0.3, [&keep_talking, &p] { keep_talking(p); });
  };
  ElasticJob job(2, kTwoHosts, [&](FakeProcess& p) {
    if (!p.env("DTRAIN_SPARE").empty()) return;  // a joiner: loading
    bool second_host = p.request.remote->name == "198.51.100.2";
    if (!second_host || quiet) p.print(started_event());
    if (!second_host && quiet) keep_talking(p);
    if (task_of(p) == "worker:3" && !quiet)
      boost::asio::post(*p.io, [&] { h->lose_second_host(); });
  });
  h = &job;
  std::function<void()> stop_after_shrink = [&] {
    if (job.has_event("shrink")) return job.supervisor->stop(SIGTERM);
    job.after(0.1, stop_after_shrink);
  };
  job.after(0.1, stop_after_shrink);
  auto r = job.run(15);
  CHECK(r.status == "stopped");
  std::string events = job.events();
  CHECK(events.find(R"("event":"shrink","attempt":0,"generation":1,"world_size":2,)"
                    R"("host":"198.51.100.2","tasks":["worker:2","worker:3"],"members":"0,1",)") !=
        std::string::npos);
  if (quiet) {
    CHECK(events.find(R"("why":"frozen: no word from it for )") != std::string::npos);
  } else {
    CHECK(events.find(R"("event":"start_failure","task":"worker:2")") != std::string::npos);
    common::ReformReply reply = reform_reply(job.process(0).replies().at(0));
    CHECK(reply.generation == 1);
    CHECK(reply.members == "0,1");
  }
  CHECK(job.state().find(R"("world_size":2,)") != std::string::npos);
}

// The tasks of a host left join together: one whose session outlives the try (the agent's
// SIGKILL unanswered, the session closed from here 2 s later) is started too once it is gone.
TEST_CASE("elastic: a task of the lost host whose session ends late joins again too") {
  ElasticJob* h = nullptr;
  ElasticJob job(2, kTwoHosts, [&](FakeProcess& p) {
    p.print(started_event());
    if (std::string joiner = p.env("DTRAIN_SPARE"); !joiner.empty()) {
      h->relay(p, 9, spare_request(joiner));
      if (joiner == "worker:3") h->after(0.05, [h] { h->supervisor->stop(SIGTERM); });
      return;
    }
    if (task_of(p) != "worker:3") return;
    boost::asio::post(*p.io, [&] {  // only worker:2's session ends; worker:3's hangs
      h->relay(h->process(0), 1, reform_request("worker:0", 0));
      h->process(2).end(ExitStatus::exited(255));
    });
  });
  h = &job;
  job.after(5, [&] { job.supervisor->stop(SIGTERM); });  // if worker:3 never joins
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.has_event("shrink"));
  const std::vector<int>& signals = job.process(3).signals;  // closed from here at last
  CHECK(std::find(signals.begin(), signals.end(), SIGKILL) != signals.end());
  std::set<std::string> joined;
  for (const FakeProcess* joiner : job.joiners()) joined.insert(joiner->env("DTRAIN_SPARE"));
  CHECK(joined == std::set<std::string>{"worker:2", "worker:3"});
  CHECK(world_size_in(job.state()) == 4);
}

// A joiner that fails while another of its host warms up: the group grows with the one that
// came, and the other gets a try of its own.
TEST_CASE("elastic: a task whose joiner failed while another's joined is tried again") {
  ElasticJob* h = nullptr;
  int worker3_joiners = 0;
  ElasticJob job(2, kTwoHosts, [&](FakeProcess& p) {
    std::string joiner = p.env("DTRAIN_SPARE");
    if (joiner == "worker:3" && ++worker3_joiners == 1) {  // not yet reachable for it
      p.print("ssh: connect to host 198.51.100.2 port 22: Connection timed out\r\n");
      return p.end(ExitStatus::exited(255));
    }
    p.print(started_event());
    if (joiner == "worker:2") {  // warm a little later
      h->after(0.05, [h, &p] { h->relay(p, 9, spare_request("worker:2")); });
      return;
    }
    if (joiner == "worker:3") {
      h->relay(p, 9, spare_request("worker:3"));
      h->after(0.05, [h] { h->supervisor->stop(SIGTERM); });
      return;
    }
    if (task_of(p) == "worker:3") boost::asio::post(*p.io, [&] { h->lose_second_host(); });
  });
  h = &job;
  job.after(3, [&] { job.supervisor->stop(SIGTERM); });
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(worker3_joiners == 2);
  std::string events = job.events();
  CHECK(events.find(R"("event":"grow","attempt":0,"generation":2,"world_size":3,)"
                    R"("host":"198.51.100.2","tasks":["worker:2"])") != std::string::npos);
  CHECK(events.find(R"("event":"grow","attempt":0,"generation":3,"world_size":4,)"
                    R"("host":"198.51.100.2","tasks":["worker:3"])") != std::string::npos);
  CHECK(world_size_in(job.state()) == 4);
}

TEST_CASE("elastic: a loss that would leave fewer than min_workers takes the in-place path") {
  ElasticJob* h = nullptr;
  ElasticJob job(3, kTwoHosts, [&](FakeProcess& p) {
    p.print(started_event());
    if (generation_of(p) > 0) {  // a replacement: the old path ran
      if (task_of(p) == "worker:3") boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      return;
    }
    if (task_of(p) == "worker:3") boost::asio::post(*p.io, [&] { h->lose_second_host(); });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK_FALSE(job.has_event("shrink"));
  std::string events = job.events();
  CHECK(events.find(R"("event":"in_place","task":"worker:2")") != std::string::npos);
  CHECK(events.find(R"("event":"in_place","task":"worker:3")") != std::string::npos);
  CHECK(job.joiners().empty());
  REQUIRE(job.spawner.processes.size() == 6);
  CHECK(task_of(job.process(4)) == "worker:2");
  CHECK(job.process(4).request.remote->name == "198.51.100.2");
  common::ReformReply reply = reform_reply(job.process(0).replies().at(0));
  CHECK(reply.ok);
  CHECK(reply.generation == 1);
  CHECK(reply.members.empty());  // everyone: nobody left
  CHECK(world_size_in(job.state()) == 4);
  CHECK(job.state().find("\"away\"") == std::string::npos);
}

// A dtrain-worker group hands the chief's duties to its first member (the worker's side), so the
// chief's host may go like any other.
TEST_CASE("elastic: the chief's host lost shrinks the group to the other host") {
  ElasticJob* h = nullptr;
  std::string state_after;
  ElasticJob job(2, kTwoHosts, [&](FakeProcess& p) {
    p.print(started_event());
    p.print(watch_event());
    if (!p.env("DTRAIN_SPARE").empty() || task_of(p) != "worker:3") return;  // joiners wait
    boost::asio::post(*p.io, [&] {
      h->relay(h->process(2), 1, reform_request("worker:2", 0));
      h->relay(h->process(3), 1, reform_request("worker:3", 0));
      h->process(0).end(ExitStatus::exited(255));
      h->process(1).end(ExitStatus::exited(255));
      h->after(0.1, [&] {
        state_after = h->state();
        h->supervisor->stop(SIGTERM);
      });
    });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.events().find(R"("world_size":2,"host":"198.51.100.1",)"
                          R"("tasks":["worker:0","worker:1"],"members":"2,3")") !=
        std::string::npos);
  CHECK_FALSE(job.has_event("in_place"));
  common::ReformReply reply = reform_reply(job.process(2).replies().at(0));
  CHECK(reply.ok);
  CHECK(reply.generation == 1);
  CHECK(reply.members == "2,3");
  REQUIRE_FALSE(state_after.empty());
  auto states = worker_states(state_after);
  CHECK(states["worker:0"] != "running");
  CHECK(states["worker:2"] == "running");
}

// Only a remote task's place can be lost: a local one's end, even one read as a lost place,
// takes the in-place path.
TEST_CASE("elastic: a local task never shrinks the group") {
  ElasticJob* h = nullptr;
  ElasticJob job(
      1, R"(["localhost:1", "localhost:2", "198.51.100.2:1", "198.51.100.2:2"])",
      [&](FakeProcess& p) {
        if (p.request.agent()) p.print(started_event());
        if (generation_of(p) > 0) {
          boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
          return;
        }
        if (task_of(p) != "worker:3") return;
        boost::asio::post(*p.io, [&] {
          FakeProcess& local = h->process(1);
          local.ended = true;
          local.callbacks.on_exit(launcher::ChildEnd(
              ExitStatus::killed(SIGKILL), launcher::ChildEnd::Cause::kPlaceLost, "lost"));
          if (local.callbacks.on_output_closed) local.callbacks.on_output_closed();
        });
      });
  h = &job;
  auto r = job.run(10);
  CHECK_FALSE(job.process(1).request.agent());
  CHECK(r.status == "stopped");
  CHECK_FALSE(job.has_event("shrink"));
  CHECK(job.events().find(R"("event":"in_place","task":"worker:1")") != std::string::npos);
  CHECK(job.joiners().empty());
}

// A host that stays unreachable: each try's joiners fail to start, the next try waits twice as
// long (up to rejoin_most_seconds), and the job runs on.
TEST_CASE("elastic: joiners that cannot start are tried again later, and the job runs on") {
  ElasticJob* h = nullptr;
  std::vector<double> tries;  // on the job's simulated clock
  ElasticJob job(
      2, kTwoHosts,
      [&](FakeProcess& p) {
        if (std::string joiner = p.env("DTRAIN_SPARE"); !joiner.empty()) {
          if (joiner == "worker:2") tries.push_back(h->clock->now());
          if (tries.size() == 4) {
            boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
            return;
          }
          p.print("ssh: connect to host 198.51.100.2 port 22: No route to host\r\n");
          return p.end(ExitStatus::exited(255));
        }
        p.print(started_event());
        if (task_of(p) == "worker:3") boost::asio::post(*p.io, [&] { h->lose_second_host(); });
      },
      0.1, 0.3);
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.supervisor->attempt() == 0);
  CHECK_FALSE(r.failure);
  CHECK_FALSE(job.has_event("restart"));
  REQUIRE(tries.size() == 4);
  // The back-off between tries, exactly: doubling from 0.1 s, capped at 0.3 s.
  auto gap = [&](size_t i) { return tries[i] - tries[i - 1]; };
  CHECK(gap(1) == Approx(0.2));  // 2 x 0.1
  CHECK(gap(2) == Approx(0.3));  // 4 x 0.1, at most 0.3
  CHECK(gap(3) == Approx(0.3));  // not 0.8
  CHECK(job.joiners().size() == 8);
  CHECK(job.events().find(R"("event":"start_failure","task":"worker:2")") != std::string::npos);
  auto states = worker_states(job.state());
  CHECK(states["worker:2"] == "away");
  CHECK(world_size_in(job.state()) == 2);
}

TEST_CASE(
    "elastic: the plan refuses min_workers above the training tasks, or no recovery in place") {
  auto plan = [](const std::string& json) {
    common::JobSpec spec = common::parse_job_spec(json, "job.json");
    launcher::LaunchContext c;
    c.spec = &spec;
    c.cluster = common::resolve_cluster(spec);
    c.run_dir = "/abs/run";
    return launcher::plan_launch(c);
  };
  CHECK(plan(job_json(4, kTwoHosts)).elastic_min_workers == 4);
  CHECK(plan(R"({"job": "j", "workers": 2, "train": {}})").elastic_min_workers == 0);
  std::string too_many = testing::config_error([&] { plan(job_json(5, kTwoHosts)); });
  CHECK(too_many == "job.json: elastic.min_workers: 5 is more than the job's 4 training task(s)");
  std::string not_in_place = testing::config_error([&] {
    plan(R"({"job": "j", "cluster": {"worker": ["localhost:1", "192.0.2.7:2"]}, "train": )" +
         testing::train_with(R"(, "device": "cuda")") + R"(, "elastic": {"min_workers": 1}})");
  });
  CHECK_THAT(not_in_place,
             Catch::StartsWith(
                 "job.json: elastic: an elastic dtrain-worker job re-forms its group in place") &&
                 Catch::Contains("GPU workers on other hosts"));
}
