// The supervisor's record of one task: its plan, its process in this attempt, its log file and
// what it last reported. Private to supervisor*.cc.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/control_protocol.h"
#include "common/unique_fd.h"
#include "launcher/exit_status.h"
#include "launcher/launch_plan.h"
#include "launcher/line_splitter.h"
#include "launcher/process_spawner.h"
#include "launcher/supervisor.h"

namespace dtrain::launcher {

struct Supervisor::Task {
  enum class State {
    kIdle,      ///< not started in this attempt
    kStarting,  ///< a remote task whose agent has not yet reported its worker running
    kRunning,
    kExited,
  };

  explicit Task(const TaskPlan& p) : plan(p) {}

  const TaskPlan& plan;
  State state = State::kIdle;
  std::unique_ptr<Child> child;
  int pid = 0;
  int remote_pid = 0;        ///< a remote task's process on its host, as its agent reported it
  bool output_open = false;  ///< the group may still write (exit and end of output come apart)
  std::optional<ExitStatus> status;
  std::optional<uint64_t> oom_kills_at_spawn;  ///< the cgroup's OOM kill count (local tasks)
  double last_progress = 0;                    ///< monotonic time of its last sign of life
  std::optional<common::ControlMessage> progress;
  common::UniqueFd log;
  std::string pending;  ///< complete lines of the current chunk, written to the log in one go
  std::deque<std::string> last_lines;  ///< of this attempt, for the failure summary
  std::unique_ptr<LineSplitter> splitter;
  double spawned_at = 0;         ///< monotonic time of its latest spawn
  bool made_progress = false;    ///< a control message past restored_step since its latest spawn
  bool respawn_pending = false;  ///< replaced in place; spawned again once its output closes
  /// In place, on a lost host: the replacement starts no earlier than this (monotonic time),
  /// respawn_timer waking it (docs/design.md#in-place-recovery).
  double respawn_at = 0;
  std::unique_ptr<boost::asio::steady_timer> respawn_timer;
  /// Why the freeze watch SIGKILLed it (docs/design.md#frozen-workers); its end is blamed so.
  std::optional<std::string> frozen_why;
  /// Where its child's callbacks deliver (spawn_task); a promoted spare's moves with its child.
  std::shared_ptr<Task*> route;
  /// A spare's held request to be promoted (docs/design.md#in-place-recovery), answered when it
  /// takes a failed task's place or the job ends.
  std::function<void(const std::string& line)> spare_waiting;
  int spare_quick_ends = 0;  ///< a spare's ends in a row before it asked to be promoted
  /// In place: its ends in a row with no progress in between (its own or the group's); two
  /// take the whole-group path (a crash loop). Counted over the attempt, not one process.
  int silent_ends = 0;
  /// Elastic (docs/design.md#elastic-membership): out of the group, its host gone; joining: a
  /// process of it runs as a joiner, and join_ready holds its request once it is warm.
  bool away = false;
  /// The newest generation it was sent the notice of by notice_late_members (this attempt).
  int noticed = 0;
  /// The newest generation a reform reply told it to join (this attempt): it takes part.
  int reformed_to = 0;
  bool joining = false;
  std::function<void(const std::string& line)> join_ready;
  /// The progress record its process writes: the plan's, or a promoted spare's own.
  std::string progress_path_now;
  /// Bounds the wait for a replaced task's output to close (kill_drain_seconds).
  std::unique_ptr<boost::asio::steady_timer> drain_timer;

  bool alive() const { return state == State::kStarting || state == State::kRunning; }
  /// A new process of this task runs from now (a spawn, or a promoted spare's): what the last
  /// one reported is forgotten.
  void begin_run(std::unique_ptr<Child> process, State started, double now) {
    child = std::move(process);
    pid = child->pid();
    state = started;
    status.reset();
    last_lines.clear();
    progress.reset();
    frozen_why.reset();
    last_progress = spawned_at = now;
    made_progress = false;
  }
  /// A process of the group may still be there: it runs, or something holds its output.
  bool holds_group() const { return child && (alive() || output_open); }
  const char* state_name() const {
    if (away) return joining && alive() ? "joining" : "away";
    switch (state) {
      case State::kIdle:
        return "not started";
      case State::kStarting:
        return "starting";
      case State::kRunning:
        return "running";
      case State::kExited:
        return "exited";
    }
    return "exited";
  }

  /// Keeps line (its terminator dropped) among the last 20 of this attempt.
  void remember(std::string_view line) {
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
    last_lines.emplace_back(line);
    if (last_lines.size() > 20) last_lines.pop_front();
  }
};

}  // namespace dtrain::launcher
