// Start-up and recovery of a four-worker group on one host and on two hosts (network namespaces
// with sshd, test/support/netns_hosts.h; workers on the second host start through ssh and
// `dtrain agent`), run by scripts/bench-multi-host.sh as root. The main job's model and data, 120
// steps, a step checkpoint every 50. Start-up: from `dtrain launch` to the last worker's first
// completed step. Recovery: from SIGKILL of worker 3 (on the second host when there are two) to
// the last worker's first completed step after the restart. CLOCK_MONOTONIC is one clock for all
// namespaces. Prints one row per run. Asserts nothing.
#include <signal.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test/support/netns_hosts.h"

using namespace dtrain::testing;

namespace {

double monotonic() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The CLOCK_MONOTONIC times of a log's "first step of this run done" lines.
std::vector<double> first_steps(const std::string& log) {
  static const std::regex line(R"(first step of this run done \(CLOCK_MONOTONIC ([\d.]+)\))");
  std::vector<double> times;
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it)
    times.push_back(std::stod((*it)[1]));
  return times;
}

std::string job_file(const std::string& dir, const NetnsHosts& hosts, int host_count) {
  std::string cluster, remote_shell;
  for (int i = 0; i < 4; ++i) {
    int host = host_count == 1 ? 0 : i / 2;
    cluster += (i ? ", \"" : "\"") + hosts.host(host) + ":" + std::to_string(24000 + i) + "\"";
  }
  for (const std::string& arg : hosts.ssh_command())
    remote_shell += (remote_shell.empty() ? "\"" : ", \"") + arg + "\"";
  std::string path = dir + "/job-" + std::to_string(host_count) + ".json";
  std::ofstream(path) << R"({"job": "bench", "cluster": {"worker": [)" << cluster
                      << R"(]}, "remote_shell": [)" << remote_shell << R"(],
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

// One run; prints "hosts startup_s recovery_s".
void run_once(const NetnsHosts& hosts, const std::string& dir, int host_count, int rep) {
  std::string run = dir + "/run-" + std::to_string(host_count) + "-" + std::to_string(rep);
  std::vector<std::string> argv = hosts.exec_prefix(0);
  for (const std::string& arg : {binary("dtrain"), std::string("launch"),
                                 job_file(dir, hosts, host_count), std::string("--run-dir"), run})
    argv.push_back(arg);
  double launched = monotonic();
  BackgroundProcess launcher(argv);
  std::string pid_file = run + "/state.json";
  while (!std::filesystem::exists(run + "/backup/checkpoint.json") && monotonic() - launched < 120)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // Worker 3's own pid: the agent's start event for a remote worker (state.json has the local
  // ssh there), state.json for a local one.
  std::string events = read_all(run + "/events.jsonl"), state = read_all(pid_file);
  std::smatch m;
  std::regex remote3(R"("task":"worker:3","remote_pid":(\d+))");
  std::regex local3(R"("task":"worker:3"[^}]*"pid":(\d+))");
  int victim = std::regex_search(events, m, remote3) ? std::stoi(m[1])
               : std::regex_search(state, m, local3) ? std::stoi(m[1])
                                                     : 0;
  double killed = monotonic();
  if (victim > 0) ::kill(victim, SIGKILL);
  ProcessResult r = launcher.wait(300);
  double startup = 0, recovery = 0;
  for (int i = 0; i < 4; ++i) {
    std::vector<double> t =
        first_steps(read_all(run + "/logs/worker-" + std::to_string(i) + ".log"));
    if (!t.empty()) startup = std::max(startup, t.front() - launched);
    for (double x : t)
      if (x > killed) {
        recovery = std::max(recovery, x - killed);
        break;
      }
  }
  std::printf("%d %.2f %.2f%s\n", host_count, startup, recovery,
              r.exit_code == 0 && victim > 0 ? "" : "  # run failed or no victim");
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
  std::printf(
      "# 4 workers of the main job, 120 steps, SIGKILL of worker 3 after the first "
      "checkpoint; back-off 0.2 s\nhosts startup_s recovery_s\n");
  for (int rep = 0; rep < reps; ++rep)
    for (int host_count : {1, 2}) run_once(hosts, dir, host_count, rep);
  return 0;
}
