// See restart_policy.h.
#include "launcher/supervisor/restart_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace dtrain::launcher {
namespace {

constexpr const char* kNotTransient =
    "this looks like a configuration problem, not a transient failure; not restarting";

}  // namespace

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

std::string RestartBook::note_silent_end(SilentEnd end) {
  SilentEnd previous = std::exchange(last_silent_end_, end);
  if (end == SilentEnd::kNone || previous == SilentEnd::kNone) return "";
  if (end == SilentEnd::kStartFailed && previous == SilentEnd::kStartFailed) {
    return fmt::format(
        "a worker could not be started twice in a row (the remote shell or srun could not start "
        "it): check the host, the remote shell and the allocation; {}",
        kNotTransient);
  }
  if (end == SilentEnd::kSigkill && previous == SilentEnd::kSigkill) {
    return "a worker was killed by SIGKILL twice in a row before any worker reported progress "
           "(the kernel's OOM killer does this to a worker that needs more memory than it may "
           "use): this is no preemption; not restarting";
  }
  return fmt::format("the group failed twice in a row before any worker reported progress{}: {}",
                     end == SilentEnd::kStartFailed || previous == SilentEnd::kStartFailed
                         ? " (a worker could not be started)"
                         : "",
                     kNotTransient);
}

Decision RestartBook::decide(const AttemptEnd& end) {
  if (end.run_seconds >= policy_.healthy_seconds) consecutive_failures_ = 0;
  Decision decision = count(end);
  if (!decision.restart) return decision;
  if (end.outcome == Outcome::kPreempted && !end.start_failed) {
    decision.delay_seconds = std::min(policy_.backoff_seconds, policy_.backoff_max_seconds);
  } else {
    decision.delay_seconds = backoff(++consecutive_failures_);
  }
  return decision;
}

Decision RestartBook::decide_in_place(const AttemptEnd& end, bool place_lost) {
  if (!place_lost || end.run_seconds >= policy_.healthy_seconds) lost_place_replacements_ = 0;
  Decision decision = count(end);
  if (decision.restart && place_lost) decision.delay_seconds = backoff(++lost_place_replacements_);
  return decision;
}

Decision RestartBook::count(const AttemptEnd& end) {
  bool progressed = end.made_progress && !end.start_failed;
  switch (end.outcome) {
    case Outcome::kSuccess:
      return {false, 0, "every worker finished"};
    case Outcome::kConfigError:
      return {false, 0, "a worker reported a configuration error (exit 2); not restarting"};
    case Outcome::kNonFinite:
      return {false, 0,
              "the loss or the weights became non-finite (exit 4, TerminateOnNaN); not "
              "restarting: the same data would give the same NaN"};
    case Outcome::kPreempted: {
      if (end.start_failed) break;  // srun's end of a step that never started: a failure
      // A SIGKILL before any progress may be the OOM killer at every start, not a preemption;
      // any other preemption ends a run of silent failures.
      bool silent_kill = end.killed_by_sigkill && !progressed;
      std::string stop = note_silent_end(silent_kill ? SilentEnd::kSigkill : SilentEnd::kNone);
      if (!stop.empty()) return {false, 0, stop};
      if (preemptions_ >= policy_.max_preemptions) {
        return {false, 0, fmt::format("preemption budget used up ({} restarts)", preemptions_)};
      }
      ++preemptions_;
      return {true, 0, ""};
    }
    case Outcome::kCrashed:
    case Outcome::kFailed:
      break;
  }
  std::string stop = note_silent_end(progressed         ? SilentEnd::kNone
                                     : end.start_failed ? SilentEnd::kStartFailed
                                                        : SilentEnd::kFailed);
  if (!stop.empty()) return {false, 0, stop};
  if (restarts_ >= policy_.max_restarts) {
    return {false, 0,
            fmt::format("restart budget used up (max_restarts {})", policy_.max_restarts)};
  }
  ++restarts_;
  return {true, 0, ""};
}

}  // namespace dtrain::launcher
