// Elastic command jobs (docs/design.md#elastic-membership) against the fake spawner: a host gone
// restarts the group at once with the members alone (TF_CONFIG and torchrun's variables
// renumbered, launch_plan.h members_plan), the host is probed with `true` through the remote
// shell, and its answer restarts the group with everyone. What may not shrink (too few left, the
// chief's host, a local task) takes the failure path. Kept apart from test_elastic.cc, which is
// the in-place re-forming of dtrain-worker jobs.
#include <catch2/catch.hpp>
#include <csignal>
#include <functional>
#include <map>
#include <set>

#include "common/json.h"
#include "launcher/plan/launch_plan.h"
#include "launcher/plan/worker_env.h"
#include "test/launcher/fake_spawner.h"
#include "test/launcher/supervisor_harness.h"

using namespace dtrain;
using launcher::ExitStatus;
using testing::FakeProcess;
using Strings = std::vector<std::string>;

namespace {

// Two hosts of two workers each; worker:0 (the chief) on the first. TEST-NET-2, as in
// test_elastic.cc.
const std::string kTwoHosts =
    R"(["198.51.100.1:1", "198.51.100.1:2", "198.51.100.2:1", "198.51.100.2:2"])";
const std::string kHostOneCluster = R"({"worker": ["198.51.100.1:1", "198.51.100.1:2"]})";
const std::string kFullCluster =
    R"({"worker": ["198.51.100.1:1", "198.51.100.1:2", "198.51.100.2:1", "198.51.100.2:2"]})";
const Strings kProbeHostTwo = {"ssh", "--", "198.51.100.2", "true"};

struct CommandJobOptions {
  int min_workers = 2;
  int max_restarts = 0;  ///< a membership restart spends none
  std::string workers = kTwoHosts;
  std::string other_tasks;  ///< the cluster's other task types, e.g. an evaluator
  double startup_seconds = 5;
  std::string discovery;  ///< elastic's extra keys, e.g. host_discovery
};

std::string command_job(const CommandJobOptions& o) {
  return R"({"job": "elastic", "command": ["python3", "train.py"], "cluster": {"worker": )" +
         o.workers + o.other_tasks + R"(}, "elastic": {"min_workers": )" +
         std::to_string(o.min_workers) + o.discovery + R"(}, "restart": {"max_restarts": )" +
         std::to_string(o.max_restarts) + R"(, "grace_seconds": 0.2, "startup_seconds": )" +
         std::to_string(o.startup_seconds) +
         R"(, "backoff_seconds": 0.01, "backoff_max_seconds": 0.05}})";
}

std::string started_event() {
  return "\x1e"
         "dtrain-agent "
         R"({"event":"started","pid":42})"
         "\n";
}

bool is_probe(const FakeProcess& p) {
  return !p.request.argv.empty() && p.request.argv.back() == "true";
}
bool is_worker(const FakeProcess& p) {
  return !is_probe(p) && p.request.argv.at(0) != "/fake/hosts";
}
// "worker:1", from the task's TF_CONFIG.
std::string task_of(const FakeProcess& p) {
  common::JsonDocument doc = common::JsonDocument::parse(p.env("TF_CONFIG"), "TF_CONFIG");
  common::JsonNode task = doc.root().at("task");
  return task.at("type").as_string() + ":" + std::to_string(task.at("index").as_int(0, 99));
}
std::string tf_config(const std::string& cluster, int index) {
  return R"({"cluster": )" + cluster + R"(, "task": {"type": "worker", "index": )" +
         std::to_string(index) + "}}";
}

struct CommandJob : testing::SupervisorHarness {
  CommandJob(const CommandJobOptions& o, testing::FakeSpawner::Script script)
      : SupervisorHarness(command_job(o), std::move(script),
                          {{}, {}, {}, {}, [](launcher::SupervisorOptions& options) {
                             options.rejoin_first_seconds = 0.05;
                             options.rejoin_most_seconds = 0.2;
                           }}) {}

  FakeProcess& process(size_t i) { return *spawner.processes.at(i); }
  /// The workers (agent sessions or local processes) started for attempt, in start order.
  std::vector<const FakeProcess*> workers_of(int attempt) const {
    std::vector<const FakeProcess*> found;
    for (const auto& p : spawner.processes)
      if (is_worker(*p) && p->attempt() == attempt) found.push_back(p.get());
    return found;
  }
  std::vector<const FakeProcess*> probes() const {
    std::vector<const FakeProcess*> found;
    for (const auto& p : spawner.processes)
      if (is_probe(*p)) found.push_back(p.get());
    return found;
  }
  bool event_has(const std::string& text) const { return events().find(text) != std::string::npos; }
};

// The four workers of a full start, each with the full cluster and its own rank.
void check_full_start(const std::vector<const FakeProcess*>& workers) {
  REQUIRE(workers.size() == 4);
  for (int i = 0; i < 4; ++i) {
    INFO("worker:" << i);
    CHECK(workers[i]->env("TF_CONFIG") == tf_config(kFullCluster, i));
    CHECK(workers[i]->env("WORLD_SIZE") == "4");
    CHECK(workers[i]->env("RANK") == std::to_string(i));
    CHECK(workers[i]->env("GROUP_WORLD_SIZE") == "2");
    CHECK(workers[i]->env("GROUP_RANK") == std::to_string(i / 2));
  }
}

}  // namespace

// A session of host 2 lost (or its worker never started there): the group restarts at once with
// host 1's two workers, renumbered as a cluster of two; host 2 is probed until `true` runs there
// (a hang is killed after startup_seconds, a refusal tried again later), and then the group
// restarts with all four. Neither restart spends the budget (max_restarts 0).
TEST_CASE("elastic command: a host gone restarts the members, its answer restarts everyone") {
  bool never_started = GENERATE(false, true);
  INFO((never_started ? "its worker never started" : "its session lost"));
  CommandJob* h = nullptr;
  std::string state_with_members;
  CommandJobOptions o;
  o.startup_seconds = 0.3;
  CommandJob job(o, [&](FakeProcess& p) {
    if (is_probe(p)) {  // the first hangs (killed), the second is refused, the third answers
      size_t n = h->probes().size();
      if (n == 2) p.end(ExitStatus::exited(1));
      if (n == 3) p.end(ExitStatus::exited(0));
      return;
    }
    bool lost = never_started && p.attempt() == 0 && task_of(p) == "worker:2";
    if (!lost) p.print(started_event());
    if (p.attempt() == 1 && task_of(p) == "worker:1")
      boost::asio::post(*p.io, [&] { state_with_members = h->state(); });
    if (p.attempt() == 2 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
    if (p.attempt() != 0 || task_of(p) != "worker:3") return;
    boost::asio::post(*p.io, [&] { h->process(2).end(ExitStatus::exited(255)); });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.supervisor->attempt() == 2);
  CHECK(job.supervisor->book().restarts() == 0);
  CHECK(job.supervisor->book().preemptions() == 0);

  // The shrink, then a restart with host 1's workers alone, not counted as a failure.
  CHECK(job.event_has(R"("event":"shrink","attempt":0,"generation":0,"world_size":2,)"
                      R"("host":"198.51.100.2","tasks":["worker:2","worker:3"],"members":"0,1",)"));
  CHECK(job.event_has(R"("event":"restart","attempt":1,"delay_seconds":0,"after":"membership",)"
                      R"("restarts":0,)"));
  CHECK(job.event_has(R"("event":"teardown","attempt":0,"reason":"host 198.51.100.2 is gone )"));
  CHECK(job.event_has(": the group restarts with 2 worker(s)\""));
  check_full_start(job.workers_of(0));
  std::vector<const FakeProcess*> members = job.workers_of(1);
  REQUIRE(members.size() == 2);
  for (int i = 0; i < 2; ++i) {
    INFO("member " << i);
    const FakeProcess& p = *members[i];
    CHECK(p.request.remote->name == "198.51.100.1");
    CHECK(p.env("TF_CONFIG") == tf_config(kHostOneCluster, i));
    CHECK(p.env("RANK") == std::to_string(i));
    CHECK(p.env("LOCAL_RANK") == std::to_string(i));
    CHECK(p.env("WORLD_SIZE") == "2");
    CHECK(p.env("LOCAL_WORLD_SIZE") == "2");
    CHECK(p.env("GROUP_RANK") == "0");
    CHECK(p.env("GROUP_WORLD_SIZE") == "1");
    CHECK(p.env("MASTER_ADDR") == "198.51.100.1");
    CHECK(p.env("DTRAIN_MEMBERS").empty());  // a command program is told by its cluster
  }
  REQUIRE_FALSE(state_with_members.empty());
  CHECK(state_with_members.find(R"("world_size":2,)") != std::string::npos);

  // The probes: `true` through the job's remote shell, nothing more (no agent, no secrets).
  std::vector<const FakeProcess*> probes = job.probes();
  REQUIRE(probes.size() == 3);
  for (const FakeProcess* probe : probes) {
    CHECK(probe->request.argv == kProbeHostTwo);
    CHECK_FALSE(probe->request.agent());
    CHECK(probe->request.env.empty());
  }
  CHECK(probes[0]->signals == std::vector<int>{SIGKILL});  // it hung past startup_seconds
  CHECK(probes[1]->signals.empty());

  // The answer: a growth, a restart with everyone and the full cluster.
  CHECK(job.event_has(R"("event":"grow","attempt":1,"generation":0,"world_size":4,)"
                      R"("host":"198.51.100.2","tasks":["worker:2","worker:3"],"members":"all")"));
  CHECK(job.event_has(R"("event":"restart","attempt":2,"delay_seconds":0,"after":"membership",)"
                      R"("restarts":0,)"));
  CHECK(job.event_has(R"("event":"teardown","attempt":1,"reason":"host 198.51.100.2 answers )"
                      "again: the group restarts with 4 worker(s)\""));
  check_full_start(job.workers_of(2));
  CHECK(job.workers_of(2)[2]->request.remote->name == "198.51.100.2");
}

// The members alone may finish the job; the probe still waiting for the host gone is killed.
TEST_CASE("elastic command: the members finishing is the job's success") {
  CommandJob* h = nullptr;
  CommandJob job(CommandJobOptions{}, [&](FakeProcess& p) {
    if (is_probe(p)) {  // hangs: ssh still connecting; the members finish meanwhile
      boost::asio::post(*p.io, [&] {
        for (const auto& q : h->spawner.processes)
          if (is_worker(*q) && q->attempt() == 1) q->end(ExitStatus::exited(0));
      });
      return;
    }
    p.print(started_event());
    if (p.attempt() == 0 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->process(2).end(ExitStatus::exited(255)); });
  });
  h = &job;
  job.after(3, [&] { job.supervisor->stop(SIGTERM); });
  auto r = job.run(10);
  CHECK(r.status == "succeeded");
  CHECK(r.exit_code == 0);
  CHECK(job.supervisor->attempt() == 1);
  REQUIRE(job.probes().size() == 1);
  CHECK(job.probes()[0]->signals == std::vector<int>{SIGKILL});
  CHECK(job.probes()[0]->ended);
}

// Two hosts gone one after the other, and back one after the other: each start's cluster is the
// hosts there, renumbered in order (host 3's workers are 2 and 3 while host 2 is away).
TEST_CASE("elastic command: two hosts leave and come back one at a time") {
  CommandJob* h = nullptr;
  CommandJobOptions o;
  o.workers = R"(["198.51.100.1:1", "198.51.100.1:2", "198.51.100.2:1", "198.51.100.2:2",
                  "198.51.100.3:1", "198.51.100.3:2"])";
  // The attempt from which each host answers its probe.
  std::map<std::string, int> answers_from = {{"198.51.100.2", 2}, {"198.51.100.3", 3}};
  CommandJob job(o, [&](FakeProcess& p) {
    if (is_probe(p)) {
      bool up = h->supervisor->attempt() >= answers_from.at(p.request.argv.at(2));
      return p.end(ExitStatus::exited(up ? 0 : 1));
    }
    p.print(started_event());
    int attempt = p.attempt();
    size_t started = h->workers_of(attempt).size();
    if (attempt == 0 && started == 6)  // host 2 lost
      boost::asio::post(*p.io, [&] { h->process(2).end(ExitStatus::exited(255)); });
    if (attempt == 1 && started == 4)  // then host 3 (its second worker's session)
      boost::asio::post(*p.io, [&p] { p.end(ExitStatus::exited(255)); });
    if (attempt == 4 && started == 6)
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
  });
  h = &job;
  job.after(5, [&] { job.supervisor->stop(SIGTERM); });
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.supervisor->book().restarts() == 0);
  const std::string host1 = R"("198.51.100.1:1", "198.51.100.1:2")";
  const std::string host2 = R"("198.51.100.2:1", "198.51.100.2:2")";
  const std::string host3 = R"("198.51.100.3:1", "198.51.100.3:2")";
  std::vector<std::vector<std::string>> starts = {
      {host1, host2, host3}, {host1, host3}, {host1}, {host1, host2}, {host1, host2, host3}};
  for (int attempt = 0; attempt < 5; ++attempt) {
    INFO("attempt " << attempt);
    std::string cluster = R"({"worker": [)";
    for (size_t i = 0; i < starts[attempt].size(); ++i)
      cluster += (i ? ", " : "") + starts[attempt][i];
    cluster += "]}";
    std::vector<const FakeProcess*> workers = job.workers_of(attempt);
    REQUIRE(workers.size() == 2 * starts[attempt].size());
    for (size_t i = 0; i < workers.size(); ++i) {
      INFO("worker " << i);
      CHECK(workers[i]->env("TF_CONFIG") == tf_config(cluster, static_cast<int>(i)));
      CHECK(workers[i]->env("RANK") == std::to_string(i));
      CHECK(workers[i]->env("WORLD_SIZE") == std::to_string(workers.size()));
      CHECK(workers[i]->env("LOCAL_RANK") == std::to_string(i % 2));
      CHECK(workers[i]->env("GROUP_RANK") == std::to_string(i / 2));
      CHECK(workers[i]->env("GROUP_WORLD_SIZE") == std::to_string(starts[attempt].size()));
    }
  }
  CHECK(job.event_has(R"("event":"shrink","attempt":1,"generation":0,"world_size":2,)"
                      R"("host":"198.51.100.3","tasks":["worker:4","worker:5"],"members":"0,1",)"));
  CHECK(job.event_has(R"("event":"grow","attempt":2,"generation":0,"world_size":4,)"
                      R"("host":"198.51.100.2","tasks":["worker:2","worker:3"],)"
                      R"("members":"0,1,2,3")"));
}

// An evaluator on the host gone leaves with it: started there it could only fail (and spend the
// budget); it comes back with the host.
TEST_CASE("elastic command: an evaluator on the host gone leaves and comes back with it") {
  CommandJob* h = nullptr;
  CommandJobOptions o;
  o.other_tasks = R"(, "evaluator": ["198.51.100.2:3"])";
  CommandJob job(o, [&](FakeProcess& p) {
    if (is_probe(p)) return p.end(ExitStatus::exited(0));
    p.print(started_event());
    if (p.attempt() == 2 && task_of(p) == "evaluator:0")
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
    if (p.attempt() == 0 && task_of(p) == "evaluator:0")
      boost::asio::post(*p.io, [&] { h->process(2).end(ExitStatus::exited(255)); });
  });
  h = &job;
  job.after(3, [&] { job.supervisor->stop(SIGTERM); });
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.event_has(R"("event":"shrink","attempt":0,"generation":0,"world_size":2,)"
                      R"("host":"198.51.100.2","tasks":["worker:2","worker:3","evaluator:0"],)"));
  std::vector<const FakeProcess*> members = job.workers_of(1);
  REQUIRE(members.size() == 2);
  for (int i = 0; i < 2; ++i) CHECK(members[i]->env("TF_CONFIG") == tf_config(kHostOneCluster, i));
  CHECK(job.event_has(R"("event":"grow","attempt":1,"generation":0,"world_size":4,)"
                      R"("host":"198.51.100.2","tasks":["worker:2","worker:3","evaluator:0"],)"));
  std::vector<const FakeProcess*> everyone = job.workers_of(2);
  REQUIRE(everyone.size() == 5);
  CHECK(task_of(*everyone[4]) == "evaluator:0");
  CHECK(everyone[0]->env("TF_CONFIG").find(R"("evaluator": ["198.51.100.2:3"])") !=
        std::string::npos);
  CHECK(job.supervisor->book().restarts() == 0);
}

// restart.startup_seconds 0 turns the start time-out off (docs/job-file.md): a probe that takes
// its time is waited for, not killed at once.
TEST_CASE("elastic command: with startup_seconds 0 a slow probe is waited for") {
  CommandJob* h = nullptr;
  CommandJobOptions o;
  o.startup_seconds = 0;
  CommandJob job(o, [&](FakeProcess& p) {
    if (is_probe(p)) {
      h->after(0.2, [&p] { p.end(ExitStatus::exited(0)); });
      return;
    }
    p.print(started_event());
    if (p.attempt() == 2 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
    if (p.attempt() == 0 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->process(2).end(ExitStatus::exited(255)); });
  });
  h = &job;
  job.after(3, [&] { job.supervisor->stop(SIGTERM); });  // if the probe never counts
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  REQUIRE(job.probes().size() >= 1);
  CHECK(job.probes()[0]->signals.empty());
  CHECK(job.probes().size() == 1);
  CHECK(job.has_event("grow"));
  CHECK(job.workers_of(2).size() == 4);
}

TEST_CASE("elastic command: a loss that would leave fewer than min_workers is a failure") {
  CommandJob* h = nullptr;
  CommandJobOptions o;
  o.min_workers = 3;
  o.max_restarts = 3;
  CommandJob job(o, [&](FakeProcess& p) {
    if (is_probe(p)) return p.end(ExitStatus::exited(0));
    p.print(started_event());
    if (p.attempt() == 1 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
    if (p.attempt() == 0 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->process(2).end(ExitStatus::exited(255)); });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK_FALSE(job.has_event("shrink"));
  CHECK_FALSE(job.event_has(R"("after":"membership")"));
  CHECK(job.event_has(R"("event":"restart","attempt":1,)"));
  CHECK(job.supervisor->book().restarts() == 1);  // counted by the book
  CHECK(job.probes().empty());
  check_full_start(job.workers_of(1));
}

TEST_CASE("elastic command: the chief's host lost does not shrink the group") {
  CommandJob* h = nullptr;
  CommandJobOptions o;
  o.max_restarts = 3;
  CommandJob job(o, [&](FakeProcess& p) {
    if (is_probe(p)) return p.end(ExitStatus::exited(0));
    p.print(started_event());
    if (p.attempt() == 1 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
    if (p.attempt() == 0 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->process(0).end(ExitStatus::exited(255)); });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK_FALSE(job.has_event("shrink"));
  CHECK_FALSE(job.event_has(R"("after":"membership")"));
  CHECK(job.supervisor->book().restarts() == 1);
  CHECK(job.probes().empty());
  check_full_start(job.workers_of(1));
}

// Only a remote task's place can be gone: a local one's end, even one read as a lost place, is a
// failure of the whole group.
TEST_CASE("elastic command: a local task never shrinks the group") {
  CommandJob* h = nullptr;
  CommandJobOptions o;
  o.min_workers = 1;
  o.max_restarts = 3;
  o.workers = R"(["localhost:1", "localhost:2", "198.51.100.2:1", "198.51.100.2:2"])";
  CommandJob job(o, [&](FakeProcess& p) {
    if (is_probe(p)) return p.end(ExitStatus::exited(0));
    if (p.request.agent()) p.print(started_event());
    if (p.attempt() == 1 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
    if (p.attempt() != 0 || task_of(p) != "worker:3") return;
    boost::asio::post(*p.io, [&] {
      FakeProcess& local = h->process(1);
      local.ended = true;
      local.callbacks.on_exit(launcher::ChildEnd(ExitStatus::killed(SIGKILL),
                                                 launcher::ChildEnd::Cause::kPlaceLost, "lost"));
      if (local.callbacks.on_output_closed) local.callbacks.on_output_closed();
    });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK_FALSE(job.process(1).request.agent());
  CHECK_FALSE(job.has_event("shrink"));
  CHECK(job.supervisor->book().restarts() == 1);
  CHECK(job.workers_of(1).size() == 4);
}

// elastic.host_discovery: a member host no longer listed leaves (a restart without it); while it
// stays unlisted it is not probed; listed again, it is probed and the group restarts with it.
TEST_CASE("elastic command: host discovery lets a host go and brings it back") {
  CommandJob* h = nullptr;
  std::string listed = "198.51.100.1\n198.51.100.2\n";
  int unlisted_runs = 0;  ///< discovery runs since the members' restart
  size_t probes_while_unlisted = 99;
  CommandJobOptions o;
  o.discovery = R"(, "host_discovery": ["/fake/hosts"], "discovery_interval_seconds": 0.1)";
  CommandJob job(o, [&](FakeProcess& p) {
    if (p.request.argv.at(0) == "/fake/hosts") {
      CHECK(p.request.argv == Strings{"/fake/hosts"});
      if (h->supervisor->attempt() == 1 && ++unlisted_runs == 4) {
        probes_while_unlisted = h->probes().size();
        listed = "198.51.100.1\n# comment\n198.51.100.2:2\n";
      }
      p.print(listed);
      return p.end(ExitStatus::exited(0));
    }
    if (is_probe(p)) return p.end(ExitStatus::exited(0));
    p.print(started_event());
    if (p.attempt() == 0 && task_of(p) == "worker:3") listed = "198.51.100.1\n";
    if (p.attempt() == 2 && task_of(p) == "worker:3")
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.event_has(R"("event":"shrink","attempt":0,"generation":0,"world_size":2,)"
                      R"("host":"198.51.100.2","tasks":["worker:2","worker:3"],"members":"0,1",)"
                      R"("why":"not in elastic.host_discovery's list")"));
  CHECK(job.event_has(R"("event":"restart","attempt":1,"delay_seconds":0,"after":"membership",)"));
  std::vector<const FakeProcess*> members = job.workers_of(1);
  REQUIRE(members.size() == 2);
  for (int i = 0; i < 2; ++i) CHECK(members[i]->env("TF_CONFIG") == tf_config(kHostOneCluster, i));
  CHECK(probes_while_unlisted == 0);
  REQUIRE(job.probes().size() == 1);
  CHECK(job.probes()[0]->request.argv == kProbeHostTwo);
  CHECK(job.event_has(R"("event":"grow","attempt":1,)"));
  check_full_start(job.workers_of(2));
  CHECK(job.supervisor->book().restarts() == 0);
}

// Issue 43: output over the limit (1 MiB) was cut and the partial list applied, letting a healthy
// host go. Now such a run is a failed one: its list is not used.
TEST_CASE("elastic command: host discovery output over 1 MiB is not used") {
  CommandJob* h = nullptr;
  int runs = 0;
  CommandJobOptions o;
  o.discovery = R"(, "host_discovery": ["/fake/hosts"], "discovery_interval_seconds": 0.1)";
  CommandJob job(o, [&](FakeProcess& p) {
    if (p.request.argv.at(0) == "/fake/hosts") {
      std::string listing;  // the first MiB names only the first host; the second comes after it
      while (listing.size() <= (1u << 20)) listing += "198.51.100.1\n";
      p.print(listing + "198.51.100.2\n");
      if (++runs == 4) boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      return p.end(ExitStatus::exited(0));
    }
    if (!is_probe(p)) p.print(started_event());
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(runs >= 4);
  CHECK_FALSE(job.has_event("shrink"));
  CHECK(job.workers_of(0).size() == 4);
  CHECK(job.workers_of(1).empty());
}

// Issue 46, item 8: a discovery program that lists no host (a typo, an empty inventory) was only
// logged; taken at its word it would let every host go. It is an error event, and its list is
// not used: the group keeps its hosts.
TEST_CASE("elastic command: host discovery that lists no host is an error event") {
  CommandJob* h = nullptr;
  int runs = 0;
  CommandJobOptions o;
  o.discovery = R"(, "host_discovery": ["/fake/hosts"], "discovery_interval_seconds": 0.1)";
  CommandJob job(o, [&](FakeProcess& p) {
    if (p.request.argv.at(0) == "/fake/hosts") {
      p.print("# nothing here\n\n");
      if (++runs == 3) boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      return p.end(ExitStatus::exited(0));
    }
    if (!is_probe(p)) p.print(started_event());
  });
  h = &job;
  auto r = job.run(10);
  CHECK(r.status == "stopped");
  CHECK(job.event_has(R"("event":"discovery_error","what":"listed no host")"));
  CHECK_FALSE(job.has_event("shrink"));
  CHECK(job.workers_of(0).size() == 4);
  CHECK(job.workers_of(1).empty());
}

// Issue 43: a discovery program whose helper (in another session, out of reach of the group kill)
// held its output kept it "running" for the rest of the job, so discovery never ran again. Now at
// the deadline (max(10 s, two intervals)) its run is abandoned and the schedule goes on.
TEST_CASE("elastic command: a discovery run whose output stays open is abandoned at its deadline") {
  CommandJob* h = nullptr;
  std::vector<FakeProcess*> runs;
  CommandJobOptions o;
  o.discovery = R"(, "host_discovery": ["/fake/hosts"], "discovery_interval_seconds": 0.1)";
  CommandJob job(o, [&](FakeProcess& p) {
    if (p.request.argv.at(0) == "/fake/hosts") {
      runs.push_back(&p);
      if (runs.size() == 1) {  // exits 0 with a list that drops a host; its output stays open
        p.print("198.51.100.1\n");
        p.ended = true;  // signals no longer end it: only its output keeps it
        boost::asio::post(*p.io, [&p] {
          if (p.callbacks.on_exit) p.callbacks.on_exit(ExitStatus::exited(0));
        });
        return;
      }
      boost::asio::post(*p.io, [&] { h->supervisor->stop(SIGTERM); });
      p.print("198.51.100.1\n198.51.100.2\n");
      return p.end(ExitStatus::exited(0));
    }
    if (!is_probe(p)) p.print(started_event());
  });
  h = &job;
  auto r = job.run(30);
  CHECK(r.status == "stopped");
  REQUIRE(runs.size() >= 2);
  CHECK(runs[0]->signals == std::vector<int>{SIGKILL});
  CHECK_FALSE(job.has_event("shrink"));  // the abandoned run's list was not used
}

// launch_plan.h members_plan: the cluster without the tasks away, the rest renumbered in order;
// places, logs and hosts stay with each task.
TEST_CASE("elastic command: members_plan renumbers the tasks left") {
  common::JobSpec spec = common::parse_job_spec(
      R"({"job": "j", "command": ["python3", "train.py"], "elastic": {"min_workers": 1},
          "cluster": {"chief": ["198.51.100.1:1"],
                      "worker": ["198.51.100.1:2", "198.51.100.2:1", "198.51.100.2:2"],
                      "evaluator": ["198.51.100.3:1"]}})",
      "job.json");
  launcher::LaunchContext c;
  c.spec = &spec;
  c.cluster = common::resolve_cluster(spec);
  c.run_dir = "/abs/run";
  launcher::LaunchPlan plan = launcher::plan_launch(c);
  REQUIRE(plan.tasks.size() == 5);
  REQUIRE(plan.training_tasks == 4);
  REQUIRE(plan.places == 2);
  auto id = [](const std::string& text) { return common::parse_task_id(text); };

  SECTION("one worker of the second host away") {
    launcher::LaunchPlan view = launcher::members_plan(plan, {id("worker:1")});
    CHECK(view.cluster_json ==
          R"({"chief": ["198.51.100.1:1"], "worker": ["198.51.100.1:2", "198.51.100.2:2"], )"
          R"("evaluator": ["198.51.100.3:1"]})");
    CHECK(view.context.cluster.to_python_json() == view.cluster_json);
    CHECK(view.training_tasks == 3);
    CHECK(view.places == 2);
    REQUIRE(view.tasks.size() == 4);
    struct Expected {
      std::string task, was, where;
      std::optional<int> rank;
      int local_rank, local_world_size, group_rank;
    };
    std::vector<Expected> expected = {
        {"chief:0", "chief:0", "198.51.100.1", 0, 0, 2, 0},
        {"worker:0", "worker:0", "198.51.100.1", 1, 1, 2, 0},
        {"worker:1", "worker:2", "198.51.100.2", 2, 0, 1, 1},
        {"evaluator:0", "evaluator:0", "198.51.100.3", std::nullopt, 0, 0, 0},
    };
    for (size_t i = 0; i < expected.size(); ++i) {
      const Expected& e = expected[i];
      const launcher::TaskPlan& t = view.tasks[i];
      INFO(e.task);
      CHECK(t.task.text() == e.task);
      CHECK(t.rank == e.rank);
      CHECK(t.where == e.where);
      CHECK(t.log_path == plan.task(id(e.was)).log_path);
      CHECK(t.address == plan.task(id(e.was)).address);
      if (!e.rank) continue;
      CHECK(t.local_rank == e.local_rank);
      CHECK(t.local_world_size == e.local_world_size);
      CHECK(t.group_rank == e.group_rank);
    }
    CHECK(view.master_addr == plan.master_addr);
    // The original plan is left as it was.
    CHECK(plan.tasks.size() == 5);
    CHECK(plan.task(id("worker:2")).rank == 3);
  }

  SECTION("the second host away") {
    launcher::LaunchPlan view = launcher::members_plan(plan, {id("worker:1"), id("worker:2")});
    CHECK(view.cluster_json == R"({"chief": ["198.51.100.1:1"], "worker": ["198.51.100.1:2"], )"
                               R"("evaluator": ["198.51.100.3:1"]})");
    CHECK(view.training_tasks == 2);
    CHECK(view.places == 1);
    REQUIRE(view.tasks.size() == 3);
    CHECK(view.tasks[1].task.text() == "worker:0");
    CHECK(view.tasks[1].local_world_size == 2);
  }

  SECTION("every worker away: the type leaves the cluster") {
    launcher::LaunchPlan view =
        launcher::members_plan(plan, {id("worker:0"), id("worker:1"), id("worker:2")});
    CHECK(view.cluster_json == R"({"chief": ["198.51.100.1:1"], "evaluator": ["198.51.100.3:1"]})");
    CHECK(view.training_tasks == 1);
    REQUIRE(view.tasks.size() == 2);
    CHECK(view.tasks[0].local_world_size == 1);
    CHECK(view.tasks[1].task.text() == "evaluator:0");
  }

  SECTION("nobody away: the same plan") {
    launcher::LaunchPlan view = launcher::members_plan(plan, {});
    CHECK(view.cluster_json == plan.cluster_json);
    CHECK(view.training_tasks == 4);
    REQUIRE(view.tasks.size() == 5);
    for (size_t i = 0; i < 5; ++i) CHECK(view.tasks[i].local_rank == plan.tasks[i].local_rank);
  }
}

TEST_CASE("elastic command: a probe runs `true` through the job's remote shell, nothing else") {
  common::JobSpec spec = common::parse_job_spec(
      R"({"job": "j", "command": ["python3", "train.py"], "remote_shell": ["ssh", "-p", "2222"],
          "cluster": {"worker": ["localhost:1", "198.51.100.2:1"]}})",
      "job.json");
  launcher::LaunchContext c;
  c.spec = &spec;
  c.cluster = common::resolve_cluster(spec);
  c.run_dir = "/abs/run";
  c.cwd = "/home/me";
  c.token = "secret-token";
  launcher::LaunchPlan plan = launcher::plan_launch(c);
  launcher::SpawnRequest remote = launcher::make_probe_request(plan, plan.tasks.at(1));
  CHECK(remote.argv == Strings{"ssh", "-p", "2222", "--", "198.51.100.2", "true"});
  CHECK_FALSE(remote.agent());
  CHECK_FALSE(remote.remote);
  CHECK(remote.env.empty());
  CHECK(remote.cwd == "/home/me");
  CHECK(launcher::make_probe_request(plan, plan.tasks.at(0)).argv.empty());  // this machine
}
