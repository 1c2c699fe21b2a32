// The restart budget and back-off of a job (docs/design.md#restart-policy): failures and
// preemptions counted apart, exponential back-off with jitter that resets after a healthy run, and
// the "failed twice before any progress = configuration problem" rule, which also catches a worker
// SIGKILLed at every start (the OOM killer) and workers that never start. Pure logic: no clocks, no
// processes.
#pragma once

#include <cstdint>
#include <string>

#include "common/job_spec.h"
#include "launcher/process/exit_status.h"

namespace dtrain::launcher {

/// What ended an attempt of the group, as the supervisor saw it.
struct AttemptEnd {
  Outcome outcome = Outcome::kFailed;
  bool made_progress = false;  ///< some worker reported progress (or ran startup_seconds)
  double run_seconds = 0;      ///< how long the group ran
  /// The first failure was death by SIGKILL (killed_by_sigkill()): a preemption, unless it
  /// happens before any progress twice in a row (the OOM killer at every start).
  bool killed_by_sigkill = false;
  /// The worker never started: the remote shell or srun could not start it. Never progress.
  bool start_failed = false;
};

struct Decision {
  bool restart = false;
  double delay_seconds = 0;  ///< back-off before the next start
  std::string reason;        ///< why the job ends, when restart is false
};

class RestartBook {
 public:
  /// jitter_seed makes the ±20% jitter reproducible in tests.
  explicit RestartBook(common::RestartPolicy policy, uint64_t jitter_seed = 0);

  Decision decide(const AttemptEnd& end);
  /// One training task's end that the rest of the group outlives
  /// (docs/design.md#in-place-recovery), end describing that task alone: counted like a restart
  /// (failures and crashes from max_restarts, preemptions from max_preemptions, the same rule for
  /// ends before any progress), but with no back-off, since the replacement starts at once, and no
  /// effect on the back-off of a later whole-group restart. place_lost: the task's host or node was
  /// lost (end then describes a failure with progress, as decide's caller does): the replacement
  /// there waits an exponential back-off of its own, as a restarted group would, which an end
  /// that is not of a lost place, or a run of healthy_seconds, resets.
  Decision decide_in_place(const AttemptEnd& end, bool place_lost = false);

  int restarts() const { return restarts_; }        ///< failure restarts so far
  int preemptions() const { return preemptions_; }  ///< preemption restarts so far

 private:
  /// What an attempt that ended before any progress was, for the two-in-a-row rule's message.
  enum class SilentEnd { kNone, kFailed, kSigkill, kStartFailed };

  /// The budget and the silent-ends rule, shared by both decisions; counts the restart it allows.
  Decision count(const AttemptEnd& end);
  double backoff(int consecutive);
  /// Counts an end before any progress; the reason to stop at the second in a row, else "".
  std::string note_silent_end(SilentEnd end);

  common::RestartPolicy policy_;
  uint64_t rng_state_;
  int restarts_ = 0;
  int preemptions_ = 0;
  int consecutive_failures_ = 0;
  int lost_place_replacements_ = 0;  ///< in place: replacements in a row on a lost place
  SilentEnd last_silent_end_ = SilentEnd::kNone;  ///< the previous attempt's, if it was silent
};

}  // namespace dtrain::launcher
