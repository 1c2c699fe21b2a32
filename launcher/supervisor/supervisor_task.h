// The supervisor's record of one task: its plan, its process in this attempt, its log file and
// what it last reported. Private to supervisor*.cc.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/control_protocol.h"
#include "common/unique_fd.h"
#include "launcher/placement/process_spawner.h"
#include "launcher/plan/launch_plan.h"
#include "launcher/process/exit_status.h"
#include "launcher/process/freeze_watch.h"
#include "launcher/process/line_splitter.h"
#include "launcher/process/loop_clock.h"
#include "launcher/supervisor/supervisor.h"

namespace dtrain::launcher {

struct Supervisor::Task {
  /// Where the task is, in one value (docs/design.md#task-states). Its current process's pipe
  /// (output_open) and reports (made_progress, last_progress) are facts of that process, read
  /// beside the state, not states of the task.
  enum class State {
    kIdle,        ///< not started in this attempt
    kStarting,    ///< a remote task whose agent has not yet reported its worker running
    kRunning,     ///< its process runs: a member's, or a spare's still loading
    kSpareReady,  ///< a spare's process is warm and holds its request to be promoted (held_reply)
    kReplacing,   ///< in place: ended, its replacement waits for the old output or a back-off
    kLeaving,     ///< elastic: its host left the group; its process is being killed
    kAway,        ///< elastic: out of the group, its host gone; no process of it runs
    kJoining,     ///< elastic: out of the group; a process of it runs as a joiner, loading
    kJoinReady,   ///< elastic: its joiner is warm and holds its request to be let in (held_reply)
    kEnded,       ///< its process ended; status says how
  };

  explicit Task(const TaskPlan& p) : plan(p) {}

  const TaskPlan& plan;
  State state = State::kIdle;
  std::unique_ptr<Child> child;
  int pid = 0;
  int remote_pid = 0;  ///< a remote task's process on its host, as its agent reported it
  bool output_open =
      false;  ///< its process's group may still write (exit and end of output come apart)
  std::optional<ExitStatus> status;
  double last_progress = 0;  ///< monotonic time of its last sign of life
  std::optional<common::ControlMessage> progress;
  common::UniqueFd log;
  std::string pending;  ///< complete lines of the current chunk, written to the log in one go
  std::deque<std::string> last_lines;  ///< of this attempt, for the failure summary
  std::unique_ptr<LineSplitter> splitter;
  double spawned_at = 0;  ///< the clock's time of its latest spawn
  /// The generation its current process started in (or was promoted into): whether it started
  /// before or after a re-formation is read from this, not from times, which may be equal.
  int generation = 0;
  bool made_progress = false;  ///< a control message past restored_step since its latest spawn
  /// kReplacing, on a lost host: the replacement starts no earlier than this (monotonic time),
  /// respawn_timer waking it (docs/design.md#in-place-recovery).
  double respawn_at = 0;
  std::unique_ptr<LoopTimer> respawn_timer;
  /// The freeze watch's verdict when it SIGKILLed it (docs/design.md#frozen-workers); its end is
  /// blamed so, and a silent host's end is its host gone (recovery_policy.h).
  std::optional<FreezeVerdict> frozen;
  /// Where its child's callbacks deliver (spawn_task); a promoted spare's moves with its child.
  std::shared_ptr<Task*> route;
  /// kSpareReady: the spare's request to be promoted (docs/design.md#in-place-recovery), answered
  /// when it takes a failed task's place or the job ends. kJoinReady: the joiner's request to be
  /// let in (docs/design.md#elastic-membership), answered when the group grows or the job ends.
  std::function<void(const std::string& line)> held_reply;
  int spare_quick_ends = 0;  ///< a spare's ends in a row before it asked to be promoted
  /// In place: its ends in a row with no progress in between (its own or the group's); two
  /// take the whole-group path (a crash loop). Counted over the attempt, not one process.
  int silent_ends = 0;
  /// The newest generation it was sent the notice of by notice_late_members (this attempt).
  int noticed = 0;
  /// The newest generation a reform reply told it to join (this attempt): it takes part.
  int reformed_to = 0;
  /// The progress record its process writes: the plan's, or a promoted spare's own.
  std::string progress_path_now;
  /// Bounds the wait for a replaced task's output to close (kill_drain_seconds).
  std::unique_ptr<LoopTimer> drain_timer;

  /// A process of it runs.
  bool alive() const {
    switch (state) {
      case State::kStarting:
      case State::kRunning:
      case State::kSpareReady:
      case State::kLeaving:
      case State::kJoining:
      case State::kJoinReady:
        return true;
      default:
        return false;
    }
  }
  /// Out of the group (elastic): its host left.
  bool away() const { return state == State::kLeaving || state == State::kAway || joining(); }
  /// Out of the group, a process of it running as a joiner.
  bool joining() const { return state == State::kJoining || state == State::kJoinReady; }
  /// Its process ended (or was given up): out of the group stays out.
  void ended() { state = away() ? State::kAway : State::kEnded; }
  /// Answers the request it holds (kSpareReady, kJoinReady) with line; it is loading again.
  void answer_held(const std::string& line) {
    if (!held_reply) return;
    std::function<void(const std::string&)> reply = std::move(held_reply);
    held_reply = nullptr;
    if (state == State::kSpareReady) state = State::kRunning;
    if (state == State::kJoinReady) state = State::kJoining;
    reply(line);
  }
  /// A new process of this task runs from now (a spawn, or a promoted spare's): what the last
  /// one reported is forgotten.
  void begin_run(std::unique_ptr<Child> process, State started, double now, int gen) {
    child = std::move(process);
    generation = gen;
    pid = child->pid();
    state = started;
    status.reset();
    last_lines.clear();
    progress.reset();
    frozen.reset();
    last_progress = spawned_at = now;
    made_progress = false;
  }
  /// A process of the group may still be there: it runs, or something holds its output.
  bool holds_group() const { return child && (alive() || output_open); }
  /// As state.json and `dtrain status` show it.
  const char* state_name() const {
    switch (state) {
      case State::kIdle:
        return "not started";
      case State::kStarting:
        return "starting";
      case State::kRunning:
      case State::kSpareReady:
        return "running";
      case State::kLeaving:
      case State::kAway:
        return "away";
      case State::kJoining:
      case State::kJoinReady:
        return "joining";
      case State::kReplacing:
      case State::kEnded:
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
