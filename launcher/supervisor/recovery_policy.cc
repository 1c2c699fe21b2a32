// See recovery_policy.h. The rows, in the order they are tried, are docs/design.md's table of the
// recovery policy; test_recovery_policy holds one case per row.
#include "launcher/supervisor/recovery_policy.h"

namespace dtrain::launcher {
namespace {

// Its host leaves the group: it is gone (never started, lost, silent), or Slurm is taking its
// node. nullopt: Slurm must be asked first.
std::optional<bool> host_leaving(const EndFacts& f, bool silent_counts) {
  const bool gone = !f.started || f.place_lost || (silent_counts && f.host_silent);
  if (gone) return true;
  if (!f.slurm) return false;
  if (!f.node_leaving) return std::nullopt;
  return !f.node_leaving->empty();
}

}  // namespace

bool in_place_applies(const EndFacts& f) {
  return f.in_place && f.phase == GroupPhase::kRunning && !f.stopping &&
         f.role == TaskRole::kTraining && f.outcome != Outcome::kConfigError &&
         f.outcome != Outcome::kNonFinite && !f.saved_and_stopped && f.others_train;
}

EndDecision decide_end(const EndFacts& f) {
  EndDecision d;
  auto act = [&](EndAction action) {
    d.action = action;
    return d;
  };
  if (f.away) return act(EndAction::kAwayEnded);
  if (f.phase == GroupPhase::kEnding) return act(EndAction::kNone);
  if (f.role == TaskRole::kSpare) return act(EndAction::kRestartSpare);
  if (f.outcome == Outcome::kSuccess) {
    if (f.group_finished) return act(EndAction::kSucceed);
    if (f.re_forming && f.role == TaskRole::kTraining) return act(EndAction::kAbandonReform);
    return act(EndAction::kNone);
  }
  if (in_place_applies(f)) {
    if (f.member_finished) {
      d.refusal = InPlaceRefusal::kMemberFinished;
      return act(EndAction::kRestartGroup);
    }
    if (f.elastic && f.host_can_leave) {
      std::optional<bool> leaving = host_leaving(f, /*silent_counts=*/true);
      if (!leaving) return act(EndAction::kAskSlurm);
      if (*leaving && f.host_must_stay.empty()) return act(EndAction::kShrink);
      d.host_kept = *leaving;
    }
    d.counts_silent_end = true;
    if (f.started && f.silent_ends >= 2) {
      d.refusal = InPlaceRefusal::kCrashLoop;
      return act(EndAction::kRestartGroup);
    }
    d.counted_in_place = true;
    if (!f.budget_allows) {
      d.refusal = InPlaceRefusal::kBudget;
      return act(EndAction::kRestartGroup);
    }
    return act(EndAction::kReplace);
  }
  // An elastic command job: a membership change restarts the group without the host, as
  // torchrun's elastic agent does. A silent agent is no reason here (no freeze watch).
  if (f.elastic && !f.in_place && f.phase == GroupPhase::kRunning && !f.stopping &&
      f.role == TaskRole::kTraining && f.host_can_leave) {
    std::optional<bool> leaving = host_leaving(f, /*silent_counts=*/false);
    if (!leaving) return act(EndAction::kAskSlurm);
    if (*leaving && f.host_must_stay.empty()) return act(EndAction::kLeaveAndRestart);
    d.host_kept = *leaving;
  }
  return act(EndAction::kRestartGroup);
}

FreezeAction decide_freeze(bool verdict_names_member) {
  return verdict_names_member ? FreezeAction::kKillMember : FreezeAction::kTearDown;
}

ReplacementAction decide_replacement(bool group_running, bool backing_off, bool spare_ready) {
  if (group_running && backing_off) return ReplacementAction::kWait;
  if (!group_running) return ReplacementAction::kNone;
  return spare_ready ? ReplacementAction::kPromote : ReplacementAction::kSpawn;
}

const char* end_action_name(EndAction action) {
  switch (action) {
    case EndAction::kNone:
      return "none";
    case EndAction::kAwayEnded:
      return "away ended";
    case EndAction::kRestartSpare:
      return "restart spare";
    case EndAction::kSucceed:
      return "succeed";
    case EndAction::kAbandonReform:
      return "abandon re-formation";
    case EndAction::kAskSlurm:
      return "ask Slurm";
    case EndAction::kShrink:
      return "shrink";
    case EndAction::kReplace:
      return "replace in place";
    case EndAction::kLeaveAndRestart:
      return "leave and restart";
    case EndAction::kRestartGroup:
      return "restart group";
  }
  return "none";
}

}  // namespace dtrain::launcher
