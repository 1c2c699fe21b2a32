// `"cluster": "slurm"` on a real Slurm (slurm_cluster.h: one slurmctld, slurmd n1 and n2, munge):
// the script `dtrain slurm-script` prints is submitted with sbatch for 2 nodes x 2 tasks. The
// main job's model and data train to success with every worker a job step on its node and no
// secret on any command line; SIGKILL of one worker restarts the group as new steps, which
// succeed; `scancel --signal=TERM` (preemption) makes the workers save and exit 143, the job is
// requeued and resumes from the checkpoint to success; after scancel nothing of the job is left
// (the elastic case is test_slurm_elastic.cc).
// Skips with a WARN where the machine cannot run the test bed.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test/launcher/slurm_job.h"
#include "test/support/main_job.h"
#include "test/support/processes.h"
#include "test/support/slurm_cluster.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain::testing;

TEST_CASE(
    "slurm: sbatch of slurm-script trains the main job on n1+n2 as job steps; no secrets "
    "on command lines",
    "[slurm]") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  SlurmJob job(cluster, "slurm-main", main_job_train(1, 25));
  // While it runs: every worker is a job step (SLURM_STEP_ID) on its node, two per node, and no
  // command line shows the token or TF_CONFIG.
  std::set<std::string> steps;
  std::multiset<std::string> nodes;
  std::vector<std::string> secrets, leaks;
  bool seen = wait_for(
      [&] {
        std::vector<int> workers = processes_of_run(job.run);
        if (workers.size() < 4) return false;
        steps.clear();
        nodes.clear();
        secrets.clear();
        for (int pid : workers) {
          std::vector<std::string> env = environment_of(pid);
          steps.insert(env_value(env, "SLURM_STEP_ID"));
          nodes.insert(env_value(env, "SLURMD_NODENAME"));
          secrets.push_back(env_value(env, "DTRAIN_TOKEN"));
          secrets.push_back(env_value(env, "TF_CONFIG"));
        }
        return true;
      },
      120);
  INFO(job_details(cluster, job));
  REQUIRE(seen);
  for (const std::string& hit : command_lines_with(secrets)) leaks.push_back(hit);
  CHECK(steps.size() == 4);  // four distinct steps
  CHECK(steps.count("") == 0);
  CHECK(nodes.count("n1") == 2);
  CHECK(nodes.count("n2") == 2);
  CHECK(leaks.empty());
  std::string state = cluster.wait_job_state(job.job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 240);
  INFO(job_details(cluster, job));
  CHECK(state == "COMPLETED");
  for (int i = 0; i < 4; ++i) {
    std::string log = read_all(job.run + "/logs/worker-" + std::to_string(i) + ".log");
    INFO(log);
    CHECK(log.find("==== dtrain: attempt 0") != std::string::npos);
    CHECK(log.find("task worker:" + std::to_string(i) + ": rank " + std::to_string(i) + " of 4") !=
          std::string::npos);
    CHECK(log.find("finished") != std::string::npos);
    CHECK(log.find("\036") == std::string::npos);  // agent marker lines stay out of the logs
  }
  auto logs = run_process({binary("dtrain"), "logs", job.run, "--worker", "3", "--raw"});
  CHECK(logs.out.find("task worker:3: rank 3 of 4") != std::string::npos);
  CHECK(read_all(job.run + "/metrics.jsonl").find("\"val_accuracy\"") != std::string::npos);
  CHECK(processes_of_run(job.run).empty());
  CHECK(wait_for([&] { return cluster.job_processes().empty(); }, 10));
  // The token is in no file: not the job's folder (script, output, run directory) and not
  // Slurm's (state, spool, logs); the run directory itself is for its user only.
  std::string token = secrets.empty() ? "" : secrets.front();
  REQUIRE(token.size() == 64);
  std::vector<std::string> holders;
  for (const std::string& root : {job.dir.path(), cluster.dir()}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(
             root, std::filesystem::directory_options::skip_permission_denied)) {
      if (entry.is_regular_file() && read_all(entry.path()).find(token) != std::string::npos)
        holders.push_back(entry.path());
    }
  }
  CAPTURE(holders);
  CHECK(holders.empty());
  CHECK((std::filesystem::status(job.run).permissions() & std::filesystem::perms::others_all) ==
        std::filesystem::perms::none);
}

TEST_CASE("slurm: SIGKILL of one worker restarts the group as new job steps, which succeed",
          "[slurm]") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  SlurmJob job(cluster, "slurm-kill",
               R"("command": ["sh", "-c", "echo step=$SLURM_STEP_ID node=$SLURMD_NODENAME; exec )" +
                   binary("dtrain-test-worker") + R"( --sleep 4"])");
  int victim = 0;
  REQUIRE(wait_for(
      [&] {
        std::ifstream in(job.run + "/pids/worker-3-0.pid");
        return static_cast<bool>(in >> victim) && victim > 0;
      },
      120));
  ::kill(victim, SIGKILL);
  std::string state = cluster.wait_job_state(job.job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 120);
  INFO(job_details(cluster, job));
  CHECK(state == "COMPLETED");
  CHECK(cluster.job_info(job.job_id)["Restarts"] == "0");  // restarted inside the allocation
  std::string events = read_all(job.run + "/events.jsonl");
  CHECK(events.find("\"restart\"") != std::string::npos);
  // Attempt 1 of worker 3 ran in a new step on the same node.
  std::string log = read_all(job.run + "/logs/worker-3.log");
  INFO(log);
  size_t first = log.find("step="), second = log.find("step=", first + 1);
  REQUIRE(first != std::string::npos);
  REQUIRE(second != std::string::npos);
  CHECK(log.find("==== dtrain: attempt 1") != std::string::npos);
  CHECK(log.substr(first, log.find('\n', first) - first) !=
        log.substr(second, log.find('\n', second) - second));
  CHECK(log.find("node=n2", second) != std::string::npos);
  CHECK(processes_of_run(job.run).empty());
}

// In place under Slurm (docs/design.md#in-place-recovery): the replacement is a new job step on
// the same node, the other three workers run on, and the job completes without a restart.
TEST_CASE("slurm: in place, a SIGKILLed worker is replaced by a new step on its node", "[slurm]") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  SlurmJob job(cluster, "slurm-in-place", main_job_train(2, 40));
  // Once the chief saved epoch 1's checkpoint, worker 3 dies inside epoch 2.
  REQUIRE(wait_for(
      [&] { return read_all(job.run + "/logs/worker-0.log").find("saved ") != std::string::npos; },
      180));
  std::vector<int> victim = started_pids(job.run, "worker:3");
  REQUIRE(victim.size() == 1);
  ::kill(victim[0], SIGKILL);
  std::string state = cluster.wait_job_state(job.job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 240);
  INFO(job_details(cluster, job));
  CHECK(state == "COMPLETED");
  CHECK(cluster.job_info(job.job_id)["Restarts"] == "0");
  std::string events = read_all(job.run + "/events.jsonl");
  INFO(events);
  CHECK(events.find(R"("event":"in_place","task":"worker:3")") != std::string::npos);
  CHECK(events.find(R"("event":"recovered","attempt":0,"path":"in_place")") != std::string::npos);
  CHECK(events.find(R"("event":"restart")") == std::string::npos);
  for (const char* task : {"worker:0", "worker:1", "worker:2"})
    CHECK(started_pids(job.run, task).size() == 1);
  std::vector<int> worker_3 = started_pids(job.run, "worker:3");
  REQUIRE(worker_3.size() == 2);
  CHECK(worker_3[1] != worker_3[0]);
  std::string log = read_all(job.run + "/logs/worker-3.log");
  CHECK(log.find(", generation 1) started") != std::string::npos);
  CHECK(processes_of_run(job.run).empty());
}

TEST_CASE(
    "slurm: scancel --signal=TERM saves a checkpoint, exits 143, requeues and resumes to "
    "success",
    "[slurm]") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  SlurmJob job(cluster, "slurm-preempt", main_job_train(2, 60));
  // Signal once the chief is training (its log shows a step of epoch 1).
  REQUIRE(wait_for(
      [&] { return read_all(job.run + "/logs/worker-0.log").find("/60") != std::string::npos; },
      120));
  ProcessResult signalled = cluster.run({"scancel", "--signal=TERM", job.job_id});
  REQUIRE(signalled.exit_code == 0);
  std::string state = cluster.wait_job_state(job.job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 300);
  INFO(job_details(cluster, job));
  CHECK(state == "COMPLETED");
  CHECK(cluster.job_info(job.job_id)["Restarts"] == "1");
  std::string output = job.output();
  CHECK(output.find("requeueing job " + job.job_id) != std::string::npos);
  std::string chief = read_all(job.run + "/logs/worker-0.log");
  INFO(chief);
  CHECK(chief.find("preempted: stopped at epoch") != std::string::npos);  // saved, then 143
  CHECK(chief.find("==== dtrain: attempt 1") != std::string::npos);
  CHECK(chief.find("restored") != std::string::npos);  // the requeued run resumed
  std::string events = read_all(job.run + "/events.jsonl");
  CHECK(events.find("\"remote_signal\"") != std::string::npos);
  const std::string saved = "\"outcome\":\"preempted\",\"status\":\"exit code 143";
  size_t preempted_exits = 0;
  for (size_t at = events.find(saved); at != std::string::npos; at = events.find(saved, at + 1))
    ++preempted_exits;
  CHECK(preempted_exits == 4);  // every worker saved and exited 143, none crashed
  CHECK(events.find("crashed") == std::string::npos);
  CHECK(processes_of_run(job.run).empty());
}

TEST_CASE("slurm: after scancel of a running job nothing of it is left", "[slurm]") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  SlurmJob job(cluster, "slurm-cancel",
               R"("command": [")" + binary("dtrain-test-worker") +
                   R"(", "--grandchild", "--sleep", "300"])");
  bool running = wait_for([&] { return processes_of_run(job.run).size() >= 8; }, 120);
  INFO(job_details(cluster, job));
  REQUIRE(running);  // four workers and their grandchildren
  REQUIRE(cluster.run({"scancel", job.job_id}).exit_code == 0);
  // Slurm sends SIGTERM to every step and the batch script, SIGKILL after KillWait.
  CHECK(wait_for([&] { return processes_of_run(job.run).empty(); }, 30));
  CHECK(wait_for([&] { return cluster.job_processes().empty(); }, 30));
  CHECK(cluster.wait_job_state(job.job_id, {"CANCELLED"}, 30) == "CANCELLED");
}
