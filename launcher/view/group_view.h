// What the outside sees of a running group, as pure functions of a snapshot the supervisor
// takes: state.json (also the reply to `dtrain status`), the Prometheus text of --metrics-port,
// and the live line. No clock, no I/O: the snapshot carries the times.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/control_protocol.h"
#include "launcher/process/exit_status.h"

namespace dtrain::launcher {

struct TaskSnapshot {
  std::string task;  ///< "worker:1"
  std::string address;
  std::string log_path;
  int pid = 0;
  const char* state = "not started";  ///< "not started", "starting", "running", "exited"
  std::optional<ExitStatus> status;
  std::optional<common::ControlMessage> progress;
  double progress_age_seconds = 0;  ///< since its last sign of life (pid != 0)
};

struct FailureSnapshot {
  std::string task;
  int attempt = 0;
  std::string what;
  Outcome outcome = Outcome::kFailed;
};

/// An elastic group's size from a moment on (docs/design.md#elastic-membership).
struct MembershipPoint {
  std::string at;  ///< UTC, ISO 8601
  int generation = 0;
  int world_size = 0;
};

/// The worker the others wait for: the task whose last progress reports the most compute
/// seconds per step, when that is over kStragglerRatio times the median of the others' and
/// over it by at least kStragglerMinExcessSeconds (so that noise on sub-millisecond steps names
/// nobody). Needs two tasks or more reporting compute_seconds_per_step.
struct Straggler {
  std::string task;
  double compute_seconds_per_step = 0;
  double others_median_seconds = 0;  ///< the median of the other tasks' compute seconds per step
};
inline constexpr double kStragglerRatio = 1.5;
inline constexpr double kStragglerMinExcessSeconds = 0.001;
struct GroupSnapshot {
  std::string job;
  std::string run_dir;
  int launcher_pid = 0;
  std::string status;  ///< common::kStatus*
  int attempt = 0;
  int restarts = 0;
  int preemptions = 0;
  int generation = 0;           ///< of the current attempt (docs/design.md#in-place-recovery)
  int in_place_recoveries = 0;  ///< re-formations in place that stepped on, all attempts
  int64_t steps_redone = 0;     ///< by every recovery so far
  double uptime_seconds = 0;
  std::string updated_at;             ///< UTC, ISO 8601
  std::optional<std::string> reason;  ///< when done
  int exit_code = 0;                  ///< when done
  std::vector<TaskSnapshot> tasks;
  std::optional<FailureSnapshot> failure;
  /// Elastic jobs: the training tasks in the group now, and each shrink and growth.
  std::optional<int> world_size;
  std::vector<MembershipPoint> membership;
  /// The supervisor's StragglerWatch's verdict.
  std::optional<Straggler> straggler;
};

std::optional<Straggler> find_straggler(const std::vector<TaskSnapshot>& tasks);

/// The verdict `dtrain status`, state.json and the metrics give: a straggler is named only once
/// find_straggler has named the same task in kStragglerWindows windows in a row, a window being a
/// report from that task with a newer global step than the last one counted (its progress
/// messages average over their own windows). A window that names nobody or another task starts
/// over, so a noisy moment between identical workers names nobody.
inline constexpr int kStragglerWindows = 3;
class StragglerWatch {
 public:
  /// Takes a new look at the tasks (the same report twice counts once) and returns the verdict.
  std::optional<Straggler> look(const std::vector<TaskSnapshot>& tasks);

 private:
  std::string candidate_;
  int64_t counted_step_ = -1;  ///< the candidate's global step at the last window counted
  int windows_ = 0;
};

/// state.json: one JSON object, no newline. Carries "straggler" when group.straggler is set.
std::string state_json(const GroupSnapshot& group);

/// Restarts, preemptions, attempt, generation, recoveries in place, and per worker up, loss,
/// samples/s, step, compute and all-reduce wait seconds per step and whether it is the straggler,
/// in Prometheus's text format.
std::string prometheus_text(const GroupSnapshot& group);

/// The step a progress message reports: global_step, else from epoch, step and steps.
std::optional<int64_t> reported_step(const common::ControlMessage& progress);

/// The live line from the chief's progress: "attempt 1  epoch 2/5  step 10/70  loss ...  ETA 62s";
/// "" when it has not reported epoch and step. steps_per_second: the rate seen (0: unknown).
std::string live_line(int attempt, const common::ControlMessage& chief, double steps_per_second);

}  // namespace dtrain::launcher
