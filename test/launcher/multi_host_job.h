// The two-host job of the multi-host tests (netns_hosts.h): two tasks on each host, the launcher
// on the first, the second reached over ssh; and the small waits they share.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "common/progress_record.h"
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

/// Runs job undisturbed into dir/calm; its final model's bytes (the model every disturbed run of
/// the same job must end with).
inline std::string undisturbed_model(const TempDir& dir, const NetnsHosts& hosts,
                                     const std::string& job) {
  ProcessOptions options;
  options.timeout_seconds = 240;
  std::string calm = dir.path() + "/calm";
  BackgroundProcess reference(launch_argv(hosts, job, calm), options);
  auto undisturbed = reference.wait(240);
  INFO(undisturbed.out << undisturbed.err);
  REQUIRE(undisturbed.exit_code == 0);
  std::string expected = read_all(calm + "/model/model.safetensors");
  REQUIRE_FALSE(expected.empty());
  return expected;
}

/// The events of kind in run's events.jsonl, in order.
inline std::vector<common::JsonDocument> events(const std::string& run, const std::string& kind) {
  std::vector<common::JsonDocument> out;
  std::ifstream in(run + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    common::JsonDocument e = common::JsonDocument::parse(line, "events.jsonl");
    if (e.root().at("event").as_string() == kind) out.push_back(std::move(e));
  }
  return out;
}

/// Worker 0's (local) global step from its progress record; -1 before it has one.
inline int64_t step_of_worker_0(const std::string& run) {
  std::optional<common::ProgressSample> r =
      common::read_progress_record(run + "/progress/worker-0");
  return r ? static_cast<int64_t>(r->global_step) : -1;
}

/// Waits until worker 0 has reached step; false when seconds pass or the launcher ends.
inline bool wait_for_step(const std::string& run, int64_t step, int launcher_pid, double seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline && process_alive(launcher_pid)) {
    if (step_of_worker_0(run) >= step) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
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
