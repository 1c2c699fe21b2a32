// Launcher latencies, measured on real processes (run by scripts/bench-launcher.sh):
//   notice   - a worker's SIGKILL to the launcher recording its exit (events.jsonl "exit")
//   teardown - the SIGKILL to the launcher deciding to restart (group stopped)
//   running  - the SIGKILL to every worker of the next attempt executing (back-off 0)
//   logs -f  - a worker's printf to `dtrain logs -f` printing that line
// Times come from CLOCK_MONOTONIC in every process. Not a test: it prints figures, asserts nothing.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "common/json.h"

namespace {
namespace fs = std::filesystem;

double mono() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9;
}

pid_t start(const std::vector<std::string>& argv, const std::string& cwd, const std::string& out) {
  std::fflush(stdout);  // or the child would print our buffered lines again
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(cwd.c_str()) != 0) ::_exit(127);
    if (!std::freopen(out.c_str(), "w", stdout) || ::dup2(STDOUT_FILENO, STDERR_FILENO) < 0)
      ::_exit(127);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Reads "pid mono" from a test_worker pid file; waits up to 30 s for it.
std::pair<int, double> wait_pid_file(const std::string& path) {
  for (int i = 0; i < 30000; ++i) {
    std::ifstream in(path);
    int pid = 0;
    double when = 0;
    if (in >> pid >> when && when > 0) return {pid, when};
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "bench: timed out waiting for %s\n", path.c_str());
  std::exit(1);
}

struct Stats {
  std::vector<double> ms;
  void add(double seconds) { ms.push_back(seconds * 1000); }
  double pct(double p) {
    std::sort(ms.begin(), ms.end());
    return ms.empty() ? 0 : ms[std::min(ms.size() - 1, static_cast<size_t>(p * ms.size()))];
  }
};

void print_row(const char* name, Stats& s) {
  std::printf("%-10s %6zu %8.2f %8.2f %8.2f\n", name, s.ms.size(), s.pct(0.5), s.pct(0.9),
              s.pct(1.0));
}

void write_job(const std::string& path, int workers, const std::string& worker_bin,
               const std::string& args) {
  std::ofstream(path) << R"({"job": "bench", "workers": )" << workers << R"(, "command": [")"
                      << worker_bin << "\", " << args
                      << R"(], "restart": {"max_restarts": 0, "max_preemptions": 100000,
      "backoff_seconds": 0, "grace_seconds": 5}})";
}

void restart_latency(const std::string& dtrain, const std::string& worker, const std::string& dir,
                     int workers, int trials) {
  write_job(dir + "/job.json", workers, worker, R"("--sleep", "1000")");
  fs::remove_all(dir + "/runs");
  pid_t launcher = start({dtrain, "launch", "job.json"}, dir, dir + "/launcher.out");
  std::string pids = dir + "/runs/bench/pids/";
  std::vector<double> killed_at;
  Stats running;
  for (int attempt = 0; attempt <= trials; ++attempt) {
    double last_up = 0;
    std::vector<int> pid(workers);
    for (int w = 0; w < workers; ++w) {
      auto [p, up] = wait_pid_file(pids + "worker-" + std::to_string(w) + "-" +
                                   std::to_string(attempt) + ".pid");
      pid[w] = p;
      last_up = std::max(last_up, up);
    }
    if (attempt > 0) running.add(last_up - killed_at.back());
    if (attempt == trials) break;
    killed_at.push_back(mono());
    ::kill(pid[attempt % workers], SIGKILL);
  }
  ::kill(launcher, SIGTERM);
  ::waitpid(launcher, nullptr, 0);
  // Read the launcher's own times for the first exit and the restart decision of each attempt.
  std::map<int, double> first_exit, restart;
  std::ifstream events(dir + "/runs/bench/events.jsonl");
  for (std::string line; std::getline(events, line);) {
    auto doc = dtrain::common::JsonDocument::parse(line, "events");
    std::string kind = doc.root().at("event").as_string();
    double when = doc.root().at("mono").as_number(0, 1e12);
    auto attempt_node = doc.root().find("attempt");
    if (!attempt_node) continue;
    int attempt = static_cast<int>(attempt_node->as_int(0, 1 << 30));
    if (kind == "exit" && !first_exit.count(attempt)) first_exit[attempt] = when;
    if (kind == "restart") restart[attempt - 1] = when;
  }
  Stats notice, teardown;
  for (int a = 0; a < trials; ++a) {
    notice.add(first_exit[a] - killed_at[a]);
    teardown.add(restart[a] - killed_at[a]);
  }
  std::printf("# %d workers, %d restarts (SIGKILL of one worker each), back-off 0\n", workers,
              trials);
  std::printf("%-10s %6s %8s %8s %8s\n", "metric", "trials", "p50_ms", "p90_ms", "max_ms");
  print_row("notice", notice);
  print_row("teardown", teardown);
  print_row("running", running);
}

void logs_latency(const std::string& dtrain, const std::string& worker, const std::string& dir,
                  double seconds) {
  write_job(dir + "/job.json", 1, worker,
            R"("--tick", "0.02", "--sleep", ")" + std::to_string(seconds) + "\"");
  fs::remove_all(dir + "/runs");
  pid_t launcher = start({dtrain, "launch", "job.json"}, dir, "/dev/null");
  wait_pid_file(dir + "/runs/bench/pids/worker-0-0.pid");
  std::string cmd = dtrain + " logs " + dir + "/runs/bench -f --raw -n 0 --worker 0";
  FILE* follow = ::popen(cmd.c_str(), "r");
  Stats latency;
  char line[256];
  while (std::fgets(line, sizeof line, follow)) {
    double now = mono();
    double sent = 0;
    if (std::sscanf(line, "tick %lf", &sent) == 1) latency.add(now - sent);
  }
  ::pclose(follow);
  ::waitpid(launcher, nullptr, 0);
  print_row("logs -f", latency);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: launcher_latency DTRAIN TEST_WORKER WORK_DIR [WORKERS] [TRIALS]\n");
    return 2;
  }
  int workers = argc > 4 ? std::atoi(argv[4]) : 8;
  int trials = argc > 5 ? std::atoi(argv[5]) : 30;
  fs::create_directories(argv[3]);
  restart_latency(argv[1], argv[2], argv[3], workers, trials);
  logs_latency(argv[1], argv[2], argv[3], 5.0);
  return 0;
}
