// Finds the member a stalled training group waits for (docs/design.md#frozen-workers), from what
// the launcher can see without the workers' help: each member's progress record
// (common/progress_record.h) and its process's state, CPU time and run-queue wait in /proc. A
// member is judged on the time it could have used: time it spent waiting for a CPU, in
// uninterruptible I/O (state D) or in a phase it declared busy (saving, validating) does not
// count against it. A first verdict is a warning; only one that persists is final. A pure
// function of the observations given to it, apart from read_process(), so it is tested on
// hand-made ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/progress_record.h"

namespace dtrain::launcher {

/// /proc/<pid>/stat and the schedstat of each of its threads.
struct ProcessSample {
  char state = '?';        ///< the state letter of the process (R, S, D, T, t, Z, ...)
  uint64_t cpu_ticks = 0;  ///< user + system CPU ticks, every thread
  /// Summed over the threads' /proc/<pid>/task/<tid>/schedstat: nanoseconds on a CPU, and
  /// nanoseconds runnable but waiting on a run queue (short of CPU). Both 0 where the kernel has
  /// no schedstat.
  uint64_t run_ns = 0, wait_ns = 0;
  /// Some thread is runnable (state R in /proc/<pid>/task/<tid>/stat): the process may sleep in
  /// its main thread while a thread it waits for is held off a CPU (a quota).
  bool runnable = false;
  bool readable = false;  ///< false: no such process (or not ours to read)
};

ProcessSample read_process(int pid);

/// One member at one look.
struct MemberObservation {
  std::optional<common::ProgressSample> record;
  ProcessSample process;
  /// A remote member: seconds since its agent last reported (its link may be down); 0 for a
  /// local one, which is always seen.
  double silent_seconds = 0;
};

/// What a verdict found: a typed value, so that what follows from it never reads its text.
enum class FreezeCause {
  kStopped,   ///< a member stopped (state T)
  kSilent,    ///< a remote member's agent quiet while others are heard: its host is cut off
  kBusy,      ///< a member busy outside the collectives while the others wait
  kBlocked,   ///< a member using no CPU outside any collective while the others wait
  kLinkDown,  ///< every member inside one collective: nobody to blame
};

struct FreezeVerdict {
  FreezeCause cause = FreezeCause::kLinkDown;
  /// The member the others wait for; nullopt when the group is stuck with nobody to blame (every
  /// member inside the same collective: a link is down), which takes the whole-group path.
  std::optional<size_t> member;
  std::string why;  ///< "stopped (process state T: SIGSTOP or a debugger)", ...
  /// Seconds of the stall counted against the member: wall time less what it spent short of CPU,
  /// in state D or in a busy phase (wall time for a stopped, silent or link verdict).
  double stalled_seconds = 0;
  double bound_seconds = 0;
  /// false: the first verdict of this stall, a warning; true: it held for kConfirmFactor x the
  /// bound, and the member is to be killed (or the group torn down).
  bool confirmed = false;
};

struct FreezeSettings {
  /// The bound's floor (the job's `freeze_seconds`); the bound is max(floor, step_multiple x the
  /// median last step time).
  double floor_seconds = 10;
  double step_multiple = 20;
};

class FreezeWatch {
 public:
  /// A remote member whose agent has not reported for longer (it reports twice a second) while
  /// another member is heard from is cut off: its link or host is down.
  static constexpr double kSilentSeconds = 3.0;
  /// A warning becomes final when the same verdict still holds at this multiple of the bound.
  static constexpr double kConfirmFactor = 1.5;

  explicit FreezeWatch(FreezeSettings settings = {});

  /// Forgets what it saw (a new attempt, a replacement started): no verdict until every member
  /// has ended a collective since. fresh: every member is a new process (a new attempt), so any
  /// record it shows is its own; otherwise the members' records at the next look are the old
  /// ones to move past.
  void reset(bool fresh = false);
  /// One look at the members (the same members in the same order each time). Returns at most one
  /// warning (confirmed false) per stall, once its verdict passes the bound, then the confirmed
  /// verdict once it passes kConfirmFactor x the bound; nullopt otherwise. Verdicts: a member
  /// stopped (state T) for longer than the bound, or a remote member quiet for kSilentSeconds
  /// while another is heard from and no record changed for longer than the bound, whatever else
  /// the records say (a group forming again, still loading); or, once the group has made no
  /// progress (no member's record changed) for longer than the bound, not while any member has
  /// no record or has not finished a step: the member that has not begun the collective the
  /// others wait in, judged on the time it could have used, or nobody (all inside one collective).
  std::optional<FreezeVerdict> observe(double now, const std::vector<MemberObservation>& members);
  /// The bound in force at the last look (0 before one could be set).
  double bound_seconds() const { return bound_; }

 private:
  FreezeSettings settings_;
  double last_advance_ = -1;
  double bound_ = 0;
  std::vector<common::ProgressSample> last_;  ///< each member's record at the last advance
  std::vector<uint64_t> cpu_at_advance_;      ///< each member's CPU ticks then
  std::vector<double> usable_;  ///< each member's seconds since then it could have used
  std::vector<bool> ended_since_reset_;
  /// Each member's (pid, collectives ended) at the first look after a reset; nullopt: it had no
  /// record then. A member has ended a collective since when its count grew past this, or when
  /// its record is a new one (a process started since) that has ended any.
  std::vector<std::optional<std::pair<int, uint64_t>>> at_reset_;
  bool at_reset_taken_ = false;
  std::vector<double> stopped_since_;  ///< when each member was first seen stopped; -1: not
  std::vector<std::optional<common::ProgressSample>> seen_;  ///< each record at the last look
  std::vector<ProcessSample> process_seen_;                  ///< each process at the last look
  double last_look_ = -1;
  double changed_at_ = -1;  ///< when a record last changed (any look, records or not)
  bool warned_ = false;     ///< this stall's warning was given

  /// The verdicts that need no record: a member stopped for longer than the bound, or quiet.
  std::optional<FreezeVerdict> stopped_or_silent(double now,
                                                 const std::vector<MemberObservation>& members);
  /// The verdict from the records, before the warning rule.
  std::optional<FreezeVerdict> stalled(double now, const std::vector<MemberObservation>& members);
  /// Adds to usable_ each member's share of the time since the last look.
  void count_usable(double now, const std::vector<MemberObservation>& members);
  /// Applies the warning rule to a verdict past the bound.
  std::optional<FreezeVerdict> warn_or_confirm(FreezeVerdict v);
};

}  // namespace dtrain::launcher
