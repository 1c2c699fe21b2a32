// The two-host job of the multi-host tests (netns_hosts.h): two tasks on each host, the launcher
// on the first, the second reached over ssh; and the small waits they share.
#pragma once

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "test/support/netns_hosts.h"
#include "test/support/processes.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

namespace dtrain::testing {

// A job with two tasks on each host; train is the "train" object, or empty with command.
inline std::string write_job(const TempDir& dir, const NetnsHosts& hosts, const std::string& body) {
  std::string cluster;
  for (int i = 0; i < 4; ++i) {
    cluster += (i ? ", " : "") + std::string("\"") + hosts.host(i / 2) + ":" +
               std::to_string(23456 + i % 2) + "\"";
  }
  std::string remote_shell;
  for (const std::string& arg : hosts.ssh_command())
    remote_shell += (remote_shell.empty() ? "" : ", ") + std::string("\"") + arg + "\"";
  std::string path = dir.path() + "/job.json";
  std::ofstream(path) << R"({"job": "two-hosts", "cluster": {"worker": [)" << cluster
                      << R"(]}, "remote_shell": [)" << remote_shell
                      << R"(], "restart": {"max_restarts": 2, "backoff_seconds": 0.2,
                         "grace_seconds": 5}, "env": {"DTRAIN_CACHE_DIR": ")"
                      << dir.path() << R"(/idx-cache"}, )" << body << "}";
  return path;
}

inline std::vector<std::string> launch_argv(const NetnsHosts& hosts, const std::string& job,
                                            const std::string& run_dir) {
  std::vector<std::string> argv = hosts.exec_prefix(0);
  for (const std::string& arg :
       {binary("dtrain"), std::string("launch"), job, std::string("--run-dir"), run_dir})
    argv.push_back(arg);
  return argv;
}

inline int wait_pid_file(const std::string& path, double seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    int pid = 0;
    if (in >> pid && pid > 0) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

}  // namespace dtrain::testing
