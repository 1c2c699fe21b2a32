// Start-up and recovery of a four-worker group on one host, on two hosts (network namespaces
// with sshd, test/support/netns_hosts.h; workers on the second host start through ssh and
// `dtrain agent`), and as Slurm job steps on two nodes (test/support/slurm_cluster.h; the
// script `dtrain slurm-script` prints, submitted with sbatch), run by scripts/bench-multi-host.sh
// as root. The main job's model and data, 120 steps, a step checkpoint every 50. Start-up: from
// `dtrain launch` (for Slurm: the launcher's first event, so queueing is not counted) to the last
// worker's first completed step. Recovery: from SIGKILL of worker 3 (on the second host or node)
// to the last worker's first completed step after the restart. CLOCK_MONOTONIC is one clock for
// all namespaces and nodes. Prints one row per run. Asserts nothing.
#include <signal.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test/support/netns_hosts.h"
#include "test/support/processes.h"
#include "test/support/slurm_cluster.h"

using namespace dtrain::testing;

namespace {

double monotonic() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// The CLOCK_MONOTONIC times of a log's "first step of this run done" lines.
std::vector<double> first_steps(const std::string& log) {
  static const std::regex line(R"(first step of this run done \(CLOCK_MONOTONIC ([\d.]+)\))");
  std::vector<double> times;
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it)
    times.push_back(std::stod((*it)[1]));
  return times;
}

// cluster: the job file's "cluster" (and whatever else goes before "restart").
std::string write_job(const std::string& path, const std::string& cluster) {
  std::ofstream(path) << R"({"job": "bench", "cluster": )" << cluster << R"(,
    "restart": {"max_restarts": 3, "backoff_seconds": 0.2, "grace_seconds": 10},
    "train": {"model": {"input_shape": [28, 28, 1], "layers": [
      {"type": "conv2d", "filters": 32, "kernel_size": 3, "activation": "relu"},
      {"type": "flatten"}, {"type": "dense", "units": 128, "activation": "relu"},
      {"type": "dense", "units": 10}]},
    "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
    "optimizer": {"type": "sgd", "learning_rate": 0.01, "momentum": 0.9},
    "data": {"source": "idx", "dir": "/usr/share/datasets/fashion-mnist"},
    "per_worker_batch_size": 64, "epochs": 1, "steps_per_epoch": 120, "validation": false,
    "seed": 42, "backup": {"dir": "backup", "save_freq": 50, "keep": 2,
    "delete_on_success": false}}})";
  return path;
}

std::string job_file(const std::string& dir, const NetnsHosts& hosts, int host_count) {
  std::string cluster, remote_shell;
  for (int i = 0; i < 4; ++i) {
    int host = host_count == 1 ? 0 : i / 2;
    cluster += (i ? ", \"" : "\"") + hosts.host(host) + ":" + std::to_string(24000 + i) + "\"";
  }
  for (const std::string& arg : hosts.ssh_command())
    remote_shell += (remote_shell.empty() ? "\"" : ", \"") + arg + "\"";
  return write_job(dir + "/job-" + std::to_string(host_count) + ".json",
                   R"({"worker": [)" + cluster + R"(]}, "remote_shell": [)" + remote_shell + "]");
}

// Worker 3's own pid: the agent's start event for a worker started through an agent (state.json
// has the local ssh or srun there), state.json for a local one.
int worker_3_pid(const std::string& run) {
  std::string events = read_all(run + "/events.jsonl"), state = read_all(run + "/state.json");
  std::smatch m;
  std::regex remote3(R"("task":"worker:3","remote_pid":(\d+))");
  std::regex local3(R"("task":"worker:3"[^}]*"pid":(\d+))");
  return std::regex_search(events, m, remote3) ? std::stoi(m[1])
         : std::regex_search(state, m, local3) ? std::stoi(m[1])
                                               : 0;
}

// Start-up (from started) and recovery (from killed) out of the workers' first-step lines.
std::pair<double, double> figures(const std::string& run, double started, double killed) {
  double startup = 0, recovery = 0;
  for (int i = 0; i < 4; ++i) {
    std::vector<double> t =
        first_steps(read_all(run + "/logs/worker-" + std::to_string(i) + ".log"));
    if (!t.empty()) startup = std::max(startup, t.front() - started);
    for (double x : t)
      if (x > killed) {
        recovery = std::max(recovery, x - killed);
        break;
      }
  }
  return {startup, recovery};
}

bool wait_file(const std::string& path, double seconds) {
  double start = monotonic();
  while (!std::filesystem::exists(path) && monotonic() - start < seconds)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return std::filesystem::exists(path);
}

// One run on one or two hosts; prints "<mode> startup_s recovery_s".
void run_once(const NetnsHosts& hosts, const std::string& dir, int host_count, int rep) {
  std::string run = dir + "/run-" + std::to_string(host_count) + "-" + std::to_string(rep);
  std::vector<std::string> argv = hosts.exec_prefix(0);
  for (const std::string& arg : {binary("dtrain"), std::string("launch"),
                                 job_file(dir, hosts, host_count), std::string("--run-dir"), run})
    argv.push_back(arg);
  double launched = monotonic();
  BackgroundProcess launcher(argv);
  wait_file(run + "/backup/checkpoint.json", 120);
  int victim = worker_3_pid(run);
  double killed = monotonic();
  if (victim > 0) ::kill(victim, SIGKILL);
  ProcessResult r = launcher.wait(300);
  auto [startup, recovery] = figures(run, launched, killed);
  std::printf("%s %.2f %.2f%s\n", host_count == 1 ? "1-host" : "2-hosts", startup, recovery,
              r.exit_code == 0 && victim > 0 ? "" : "  # run failed or no victim");
  std::fflush(stdout);
}

// One run as Slurm job steps on nodes n1 and n2 (two each), submitted with sbatch.
void run_slurm(const SlurmCluster& cluster, const std::string& dir, int rep) {
  std::string run = dir + "/run-slurm-" + std::to_string(rep);
  std::string job =
      write_job(dir + "/job-slurm-" + std::to_string(rep) + ".json",
                R"("slurm", "run_dir": ")" + run +
                    R"(", "slurm": {"nodes": 2, "tasks_per_node": 2, "port_base": 24100})");
  ProcessOptions in_dir;
  in_dir.cwd = dir;
  ProcessResult script = run_process({binary("dtrain"), "slurm-script", job}, in_dir);
  std::string script_path = dir + "/job-slurm-" + std::to_string(rep) + ".sbatch";
  std::ofstream(script_path) << script.out;
  std::string id = cluster.sbatch(script_path);
  wait_file(run + "/backup/checkpoint.json", 120);
  std::smatch m;
  std::string events = read_all(run + "/events.jsonl");
  double started =
      std::regex_search(events, m, std::regex(R"("mono":([\d.]+))")) ? std::stod(m[1]) : 0;
  int victim = worker_3_pid(run);
  double killed = monotonic();
  if (victim > 0) ::kill(victim, SIGKILL);
  std::string state = cluster.wait_job_state(id, {"COMPLETED", "FAILED", "CANCELLED"}, 300);
  auto [startup, recovery] = figures(run, started, killed);
  std::printf(
      "slurm-2-nodes %.2f %.2f%s\n", startup, recovery,
      state == "COMPLETED" && victim > 0 && started > 0 ? "" : "  # run failed or no victim");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  NetnsHosts hosts(2);
  if (!hosts.available()) {
    std::printf("# multi-host bench skipped: %s\n", hosts.why_not().c_str());
    return 0;
  }
  std::string dir = hosts.dir() + "/bench";
  std::filesystem::create_directories(dir);
  SlurmCluster cluster;
  std::printf(
      "# 4 workers of the main job, 120 steps, SIGKILL of worker 3 after the first "
      "checkpoint; back-off 0.2 s\n");
  if (!cluster.available()) std::printf("# slurm rows skipped: %s\n", cluster.why_not().c_str());
  std::printf("mode startup_s recovery_s\n");
  for (int rep = 0; rep < reps; ++rep) {
    for (int host_count : {1, 2}) run_once(hosts, dir, host_count, rep);
    if (cluster.available()) run_slurm(cluster, dir, rep);
  }
  return 0;
}
