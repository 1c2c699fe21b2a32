// `"cluster": "slurm"` on a real Slurm (slurm_cluster.h: one slurmctld, slurmd n1 and n2, munge):
// the script `dtrain slurm-script` prints is submitted with sbatch for 2 nodes x 2 tasks. The
// main job's model and data train to success with every worker a job step on its node and no
// secret on any command line; SIGKILL of one worker restarts the group as new steps, which
// succeed; `scancel --signal=TERM` (preemption) makes the workers save and exit 143, the job is
// requeued and resumes from the checkpoint to success; an elastic job goes on without a drained
// node's workers and takes them back once it is resumed, to the same model; after scancel nothing
// of the job is left.
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

#include "test/support/main_job.h"
#include "test/support/processes.h"
#include "test/support/slurm_cluster.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain::testing;

namespace {

bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// A first port of count free ones, below the ephemeral range (the job's ports are fixed when
// it starts; the test picks them so that parallel tests cannot collide with Slurm's job ids).
int free_port_base(int count) {
  std::mt19937 random(static_cast<unsigned>(::getpid()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    int base = 20000 + static_cast<int>(random() % 12000);
    bool all = true;
    for (int p = base; p < base + count && all; ++p) all = port_free(p);
    if (all) return base;
  }
  return 0;
}

// A job directory: job.json (2 nodes x 2 tasks), the script slurm-script prints, the run dir.
struct SlurmJob {
  TempDir dir;
  std::string run;
  std::string script;
  std::string job_id;

  SlurmJob(const SlurmCluster& cluster, const std::string& name, const std::string& body) {
    run = dir.path() + "/run";
    int base = free_port_base(4);
    REQUIRE(base > 0);
    std::string job = dir.path() + "/job.json";
    std::ofstream(job) << R"({"job": ")" << name << R"(", "cluster": "slurm", "run_dir": ")" << run
                       << R"(", "slurm": {"nodes": 2, "tasks_per_node": 2, "port_base": )" << base
                       << R"(}, "restart": {"max_restarts": 2, "backoff_seconds": 0.2,
                             "grace_seconds": 8}, )"
                       << body << "}";
    ProcessOptions options;
    options.cwd = dir.path();
    ProcessResult printed = run_process({binary("dtrain"), "slurm-script", job}, options);
    INFO(printed.err);
    REQUIRE(printed.exit_code == 0);
    script = dir.path() + "/job.sbatch";
    std::ofstream(script) << printed.out;
    job_id = cluster.sbatch(script);
  }
  std::string output() const { return read_all(dir.path() + "/" + name_of_output()); }
  std::string name_of_output() const {
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      std::string file = entry.path().filename();
      if (file.size() > 4 && file.substr(file.size() - 4) == ".out") return file;
    }
    return "none.out";
  }
};

std::string job_details(const SlurmCluster& cluster, const SlurmJob& job) {
  std::string text = "slurm output:\n" + job.output() + "\njob:";
  for (const auto& [key, value] : cluster.job_info(job.job_id)) text += " " + key + "=" + value;
  return text;
}

// The pids the agents reported for task (its `remote_start` events), oldest first.
std::vector<int> started_pids(const std::string& run, const std::string& task) {
  std::vector<int> pids;
  std::string events = read_all(run + "/events.jsonl");
  const std::string key = R"("event":"remote_start","task":")" + task + R"(","remote_pid":)";
  for (size_t at = events.find(key); at != std::string::npos; at = events.find(key, at + 1))
    pids.push_back(std::atoi(events.c_str() + at + key.size()));
  return pids;
}

// The lines of run's events.jsonl of this kind.
std::vector<std::string> events_of(const std::string& run, const std::string& kind) {
  std::vector<std::string> lines;
  std::ifstream in(run + "/events.jsonl");
  for (std::string line; std::getline(in, line);)
    if (line.find(R"("event":")" + kind + "\"") != std::string::npos) lines.push_back(line);
  return lines;
}

// Seconds from since until run has an event of this kind; -1 after timeout_seconds.
double seconds_until_event(const std::string& run, const std::string& kind,
                           std::chrono::steady_clock::time_point since, double timeout_seconds) {
  if (!wait_for([&] { return !events_of(run, kind).empty(); }, timeout_seconds)) return -1;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

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

// Elastic under Slurm (docs/design.md#elastic-membership): in epoch 2, n2 is drained and its two
// workers are killed. A drained node still runs new steps, so the launcher asks Slurm: n2 is
// leaving, its workers leave the group, and n1's two train on holding the missing workers'
// virtual shards. n2 is resumed: its workers join again as the group of four. The model is the
// undisturbed run's bit for bit.
TEST_CASE("slurm: elastic, a drained node's workers leave, n1 trains on, n2 joins again",
          "[slurm]") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  const std::string body = R"("elastic": {"min_workers": 2}, )" + main_job_train(2, 40);
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
  auto killed = std::chrono::steady_clock::now();
  for (const char* task : {"worker:2", "worker:3"}) {
    std::vector<int> victim = started_pids(job.run, task);
    REQUIRE(victim.size() == 1);
    ::kill(victim[0], SIGKILL);
  }
  double shrunk = seconds_until_event(job.run, "shrink", killed, 30);
  // n1 trains on alone (the new generation stepped), then n2 comes back.
  bool trained_on = seconds_until_event(job.run, "recovered", killed, 30) >= 0;
  auto resumed = std::chrono::steady_clock::now();
  ProcessResult resume = cluster.run({"scontrol", "update", "nodename=n2", "state=resume"});
  double grown = seconds_until_event(job.run, "grow", resumed, 30);
  state = cluster.wait_job_state(job.job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 240);
  INFO(job_details(cluster, job));
  INFO(read_all(job.run + "/events.jsonl"));
  INFO("shrink " << shrunk << " s after the kill, grow " << grown << " s after the resume");
  REQUIRE(shrunk >= 0);
  CHECK(shrunk < 5);
  CHECK(trained_on);
  CHECK(resume.exit_code == 0);
  CHECK(grown >= 0);
  CHECK(grown < 10);
  CHECK(state == "COMPLETED");
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
