// A Slurm job of the Slurm launch tests (test/support/slurm_cluster.h): the job file (2 nodes x 2
// tasks), the batch script `dtrain slurm-script` prints, submitted; and the small readers of its
// run directory they share.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "test/support/processes.h"
#include "test/support/slurm_cluster.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

namespace dtrain::testing {

inline bool port_free(int port) {
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
inline int free_port_base(int count) {
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

inline std::string job_details(const SlurmCluster& cluster, const SlurmJob& job) {
  std::string text = "slurm output:\n" + job.output() + "\njob:";
  for (const auto& [key, value] : cluster.job_info(job.job_id)) text += " " + key + "=" + value;
  return text;
}

// The pids the agents reported for task (its `remote_start` events), oldest first.
inline std::vector<int> started_pids(const std::string& run, const std::string& task) {
  std::vector<int> pids;
  std::string events = read_all(run + "/events.jsonl");
  const std::string key = R"("event":"remote_start","task":")" + task + R"(","remote_pid":)";
  for (size_t at = events.find(key); at != std::string::npos; at = events.find(key, at + 1))
    pids.push_back(std::atoi(events.c_str() + at + key.size()));
  return pids;
}

// The lines of run's events.jsonl of this kind.
inline std::vector<std::string> events_of(const std::string& run, const std::string& kind) {
  std::vector<std::string> lines;
  std::ifstream in(run + "/events.jsonl");
  for (std::string line; std::getline(in, line);)
    if (line.find(R"("event":")" + kind + "\"") != std::string::npos) lines.push_back(line);
  return lines;
}

// The kinds of run's events ("spawn", "shrink", ...), in the order events.jsonl has them.
inline std::vector<std::string> event_kinds(const std::string& run) {
  std::vector<std::string> kinds;
  std::ifstream in(run + "/events.jsonl");
  const std::string key = R"("event":")";
  for (std::string line; std::getline(in, line);) {
    size_t at = line.find(key);
    if (at == std::string::npos) continue;
    at += key.size();
    kinds.push_back(line.substr(at, line.find('"', at) - at));
  }
  return kinds;
}

// The index in kinds of the first event of kind at or after from; kinds.size() when none.
inline size_t first_event(const std::vector<std::string>& kinds, const std::string& kind,
                          size_t from = 0) {
  for (size_t i = from; i < kinds.size(); ++i)
    if (kinds[i] == kind) return i;
  return kinds.size();
}

}  // namespace dtrain::testing
