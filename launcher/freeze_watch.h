// Finds the member a stalled training group waits for (docs/design.md#frozen-workers), from what
// the launcher can see without the workers' help: each member's progress record
// (common/progress_record.h) and its process's state and CPU time in /proc. A pure function of
// the observations given to it, apart from read_process(), so it is tested on hand-made ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/progress_record.h"

namespace dtrain::launcher {

/// /proc/<pid>/stat: the state letter (R, S, D, T, t, Z, ...) and user + system CPU ticks.
struct ProcessSample {
  char state = '?';
  uint64_t cpu_ticks = 0;
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

struct FreezeVerdict {
  /// The member the others wait for; nullopt when the group is stuck with nobody to blame (every
  /// member inside the same collective: a link is down), which takes the whole-group path.
  std::optional<size_t> member;
  std::string why;  ///< "stopped (process state T: SIGSTOP or a debugger)", ...
  double stalled_seconds = 0;
  double bound_seconds = 0;
};

class FreezeWatch {
 public:
  /// A remote member whose agent has not reported for longer (it reports twice a second) while
  /// another member is heard from is cut off: its link or host is down.
  static constexpr double kSilentSeconds = 3.0;

  /// The group is judged frozen after max(min_seconds, step_multiple x the median last step time)
  /// without progress.
  explicit FreezeWatch(double min_seconds = 2, double step_multiple = 20);

  /// Forgets what it saw (a new attempt, a replacement started): no verdict until every member
  /// has ended a collective since.
  void reset();
  /// One look at the members (the same members in the same order each time). Returns a verdict
  /// once a member has been stopped (state T) for longer than the bound, or a remote member has
  /// been quiet for kSilentSeconds while another is heard from and no record changed for longer
  /// than the bound, whatever else the records say (a group forming again, still loading); or
  /// once the group has made no progress (no member's record changed) for longer than the bound,
  /// not while any member has no record or has not finished a step.
  std::optional<FreezeVerdict> observe(double now, const std::vector<MemberObservation>& members);
  /// The bound in force at the last look (0 before one could be set).
  double bound_seconds() const { return bound_; }

 private:
  double min_seconds_, step_multiple_;
  double last_advance_ = -1;
  double bound_ = 0;
  std::vector<common::ProgressSample> last_;  ///< each member's record at the last advance
  std::vector<uint64_t> cpu_at_advance_;      ///< each member's CPU ticks then
  std::vector<bool> ended_since_reset_;
  std::vector<double> stopped_since_;  ///< when each member was first seen stopped; -1: not
  std::vector<std::optional<common::ProgressSample>> seen_;  ///< each record at the last look
  double changed_at_ = -1;  ///< when a record last changed (any look, records or not)

  /// The verdicts that need no record: a member stopped for longer than the bound, or quiet.
  std::optional<FreezeVerdict> stopped_or_silent(double now,
                                                 const std::vector<MemberObservation>& members);
};

}  // namespace dtrain::launcher
