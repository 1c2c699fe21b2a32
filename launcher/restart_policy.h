// The restart budget and back-off of a job (docs/design.md#restart-policy): failures and
// preemptions counted apart, exponential back-off with jitter that resets after a healthy run,
// and the "failed twice before any progress = configuration problem" rule. Pure logic: no
// clocks, no processes.
#pragma once

#include <cstdint>
#include <string>

#include "common/job_spec.h"
#include "launcher/exit_status.h"

namespace dtrain::launcher {

/// What ended an attempt of the group, as the supervisor saw it.
struct AttemptEnd {
  Outcome outcome = Outcome::kFailed;
  bool made_progress = false;  ///< some worker reported progress (or ran startup_seconds)
  double run_seconds = 0;      ///< how long the group ran
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

  int restarts() const { return restarts_; }        ///< failure restarts so far
  int preemptions() const { return preemptions_; }  ///< preemption restarts so far

 private:
  double backoff(int consecutive);

  common::RestartPolicy policy_;
  uint64_t rng_state_;
  int restarts_ = 0;
  int preemptions_ = 0;
  int consecutive_failures_ = 0;
  int consecutive_silent_failures_ = 0;
};

}  // namespace dtrain::launcher
