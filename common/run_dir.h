// The run directory's layout (docs/design.md#run-directory): paths only, no I/O.
#pragma once

#include <string>

#include "common/cluster_spec.h"

namespace dtrain::common {

/// Each attempt of a worker begins its log with one line starting with this prefix, e.g.
/// "==== dtrain: attempt 1 of worker:0 (pid 4242) started 2026-11-21T19:45:00.123Z ====".
inline constexpr const char* kAttemptHeaderPrefix = "==== dtrain: attempt ";

/// The header line (without newline) for an attempt of a task. A replacement started in place
/// (generation > 0) says so: "... of worker:1 (pid 4250, generation 1) started ...".
std::string attempt_header(int attempt, const TaskId& task, int pid, const std::string& utc_time,
                           int generation = 0);

/// Values of state.json's "status", in the order a run goes through them.
inline constexpr const char* kStatusStarting = "starting";
inline constexpr const char* kStatusRunning = "running";
inline constexpr const char* kStatusBackingOff = "backing off";
inline constexpr const char* kStatusStopping = "stopping";
inline constexpr const char* kStatusSucceeded = "succeeded";
inline constexpr const char* kStatusFailed = "failed";
inline constexpr const char* kStatusStopped =
    "stopped";  ///< by a signal or `dtrain stop`; resumable

/// True for the statuses after which the launcher exits.
bool is_final_status(const std::string& status);

class RunDir {
 public:
  /// root should be absolute for anything handed to a worker (DTRAIN_RUN_DIR).
  explicit RunDir(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string spec_json() const { return root_ + "/spec.json"; }
  std::string state_json() const { return root_ + "/state.json"; }
  std::string events_jsonl() const { return root_ + "/events.jsonl"; }
  std::string logs_dir() const { return root_ + "/logs"; }
  /// logs/worker-<i>.log for worker i; logs/chief-0.log, logs/evaluator-0.log for the others.
  std::string log_file(const TaskId& task) const {
    return logs_dir() + "/" + task.type + "-" + std::to_string(task.index) + ".log";
  }
  /// progress/worker-<i>: a dtrain-worker training task's progress record
  /// (docs/design.md#frozen-workers).
  std::string progress_dir() const { return root_ + "/progress"; }
  std::string progress_file(const TaskId& task) const {
    return progress_dir() + "/" + task.type + "-" + std::to_string(task.index);
  }
  /// ledger/worker-<i>.jsonl: train.ledger's record of the examples each step used.
  std::string ledger_file(const TaskId& task) const {
    return root_ + "/ledger/" + task.type + "-" + std::to_string(task.index) + ".jsonl";
  }
  std::string backup_dir() const { return root_ + "/backup"; }
  std::string model_dir() const { return root_ + "/model"; }
  std::string metrics_jsonl() const { return root_ + "/metrics.jsonl"; }
  /// Held (flock) by the launcher that runs this directory; a second launcher refuses.
  std::string lock_file() const { return root_ + "/launcher.lock"; }
  /// Space the launcher sets aside while it runs, freed for its last records on a full disk.
  std::string reserve_file() const { return root_ + "/launcher.reserve"; }
  /// UNIX socket the launcher listens on for worker heartbeats and client requests.
  std::string control_socket() const { return root_ + "/control.sock"; }

 private:
  std::string root_;
};

}  // namespace dtrain::common
