// See restart_policy.h.
#include "launcher/restart_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dtrain::launcher {

RestartBook::RestartBook(common::RestartPolicy policy, uint64_t jitter_seed)
    : policy_(policy), rng_state_(jitter_seed * 0x9E3779B97F4A7C15ULL + 1) {}

double RestartBook::backoff(int consecutive) {
  double base = policy_.backoff_seconds * std::pow(2.0, std::max(0, consecutive - 1));
  base = std::min(base, policy_.backoff_max_seconds);
  // xorshift64*: a ±20% jitter so restarted groups across jobs do not move in lock-step.
  rng_state_ ^= rng_state_ >> 12;
  rng_state_ ^= rng_state_ << 25;
  rng_state_ ^= rng_state_ >> 27;
  double unit =
      static_cast<double>((rng_state_ * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
  return base * (0.8 + 0.4 * unit);
}

Decision RestartBook::decide(const AttemptEnd& end) {
  if (end.run_seconds >= policy_.healthy_seconds) consecutive_failures_ = 0;
  switch (end.outcome) {
    case Outcome::kSuccess:
      return {false, 0, "every worker finished"};
    case Outcome::kConfigError:
      return {false, 0, "a worker reported a configuration error (exit 2); not restarting"};
    case Outcome::kPreempted:
      if (preemptions_ >= policy_.max_preemptions) {
        return {false, 0, fmt::format("preemption budget used up ({} restarts)", preemptions_)};
      }
      ++preemptions_;
      consecutive_silent_failures_ = 0;
      return {true, std::min(policy_.backoff_seconds, policy_.backoff_max_seconds), ""};
    case Outcome::kCrashed:
    case Outcome::kFailed:
      break;
  }
  consecutive_silent_failures_ = end.made_progress ? 0 : consecutive_silent_failures_ + 1;
  if (consecutive_silent_failures_ >= 2) {
    return {false, 0,
            "the group failed twice in a row before any worker reported progress: this looks like "
            "a configuration problem, not a transient failure; not restarting"};
  }
  if (restarts_ >= policy_.max_restarts) {
    return {false, 0,
            fmt::format("restart budget used up (max_restarts {})", policy_.max_restarts)};
  }
  ++restarts_;
  ++consecutive_failures_;
  return {true, backoff(consecutive_failures_), ""};
}

}  // namespace dtrain::launcher
