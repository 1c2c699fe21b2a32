// Elastic membership under Slurm (docs/design.md#elastic-membership): a node drained mid-run, its
// workers killed; the job goes on on the other node and ends with the undisturbed run's model,
// and the node joins again once resumed. Needs the private Slurm test bed (slurm_cluster.h).
#include <signal.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "test/launcher/slurm_job.h"
#include "test/support/main_job.h"

using namespace dtrain::testing;

namespace {
// A guard against a hang, not a time limit: far above the seconds any step here takes.
constexpr double kGuardSeconds = 120;
}  // namespace

// Elastic under Slurm (docs/design.md#elastic-membership): in epoch 2, n2 is drained and its two
// workers are killed. A drained node still runs new steps, so the launcher asks Slurm: n2 is
// leaving, its workers leave the group, and n1's two train on holding the missing workers'
// virtual shards. n2 is resumed: its workers join again as the group of four. The model is the
// undisturbed run's bit for bit.
TEST_CASE("slurm: elastic, a drained node's workers leave, n1 trains on, n2 joins again",
          "[slurm]") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  // Epoch 2 must outlast the grow (n2 back in Slurm, then a retry of up to 4 s): at 40 steps the
  // two survivors of a faster step finished first in one CI run. So worker 0 is also stopped
  // (SIGSTOP) from the resume until the grow: order, not the machine's speed, decides it; the
  // freeze watch's floor is the guard, above that hold.
  const std::string body =
      R"("elastic": {"min_workers": 2}, "freeze_seconds": 120, )" + main_job_train(2, 120);
  SlurmJob calm(cluster, "slurm-calm", body);
  std::string state =
      cluster.wait_job_state(calm.job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 240);
  INFO(job_details(cluster, calm));
  REQUIRE(state == "COMPLETED");
  std::string expected = read_all(calm.run + "/model/model.safetensors");
  REQUIRE_FALSE(expected.empty());

  SlurmJob job(cluster, "slurm-elastic", body);
  REQUIRE(wait_for(
      [&] { return read_all(job.run + "/logs/worker-0.log").find("saved ") != std::string::npos; },
      180));  // epoch 1's checkpoint: epoch 2 began
  REQUIRE(cluster.run({"scontrol", "update", "nodename=n2", "state=drain", "reason=dtrain-test"})
              .exit_code == 0);
  const size_t at_kill = event_kinds(job.run).size();
  for (const char* task : {"worker:2", "worker:3"}) {
    std::vector<int> victim = started_pids(job.run, task);
    REQUIRE(victim.size() == 1);
    ::kill(victim[0], SIGKILL);
  }
  auto after = [&](const std::string& kind, size_t from) {
    return [&run = job.run, kind, from] {
      std::vector<std::string> kinds = event_kinds(run);
      return first_event(kinds, kind, from) < kinds.size();
    };
  };
  bool shrunk = wait_for(after("shrink", at_kill), kGuardSeconds);
  // n1 trains on alone (the new generation stepped), then n2 comes back.
  size_t at_shrink = first_event(event_kinds(job.run), "shrink", at_kill);
  bool trained_on = shrunk && wait_for(after("recovered", at_shrink), kGuardSeconds);
  const size_t at_resume = event_kinds(job.run).size();
  std::vector<int> worker_0 = started_pids(job.run, "worker:0");
  REQUIRE(worker_0.size() == 1);
  const bool held = ::kill(worker_0[0], SIGSTOP) == 0;
  ProcessResult resume = cluster.run({"scontrol", "update", "nodename=n2", "state=resume"});
  bool grown = trained_on && wait_for(after("grow", at_resume), kGuardSeconds);
  ::kill(worker_0[0], SIGCONT);
  CHECK(held);
  state = cluster.wait_job_state(job.job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 240);
  INFO(job_details(cluster, job));
  INFO(read_all(job.run + "/events.jsonl"));
  // In this order: the kill, the shrink, the survivors' recovery, the resume, the grow.
  REQUIRE(shrunk);
  CHECK(trained_on);
  CHECK(resume.exit_code == 0);
  CHECK(grown);
  CHECK(state == "COMPLETED");
  std::vector<std::string> kinds = event_kinds(job.run);
  CHECK(first_event(kinds, "shrink") == at_shrink);  // none before the kill
  CHECK(first_event(kinds, "grow") >= at_resume);    // none before the resume
  std::vector<std::string> shrink = events_of(job.run, "shrink"), grow = events_of(job.run, "grow");
  REQUIRE(shrink.size() == 1);
  CHECK(shrink[0].find(R"("world_size":2,"host":"n2","tasks":["worker:2","worker:3"])") !=
        std::string::npos);
  CHECK(shrink[0].find("DRAIN") != std::string::npos);  // Slurm's word, in the why
  REQUIRE(grow.size() == 1);
  CHECK(grow[0].find(R"("world_size":4,"host":"n2")") != std::string::npos);
  CHECK(events_of(job.run, "restart").empty());
  CHECK(events_of(job.run, "in_place").empty());  // no replacement on the drained node
  CHECK(read_all(job.run + "/model/model.safetensors") == expected);
  CHECK(read_all(job.run + "/state.json").find(R"("world_size":4)") != std::string::npos);
  CHECK(processes_of_run(job.run).empty());
  CHECK(wait_for([&] { return cluster.job_processes().empty(); }, 10));
}
