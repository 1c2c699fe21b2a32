// The recovery policy (docs/design.md#the-recovery-policy): what the supervisor does about a task's
// end and about the freeze watch's verdict, as pure functions of typed facts. The supervisor
// gathers the facts (supervisor.cc, gather_end_facts), asks, and carries out the action; nothing
// here reads a clock, a process or the supervisor's records, so every row of the policy is a
// line of test_recovery_policy.
#pragma once

#include <optional>
#include <string>

#include "launcher/process/exit_status.h"

namespace dtrain::launcher {

/// What a task is to the group.
enum class TaskRole {
  kTraining,  ///< a member: one of the cluster's training tasks
  kOther,     ///< a task of the cluster that does not train (the evaluator)
  kSpare,     ///< a standby worker waiting to take a failed member's place
};

/// Where the attempt is when the end comes.
enum class GroupPhase {
  kStarting,  ///< its tasks are being started
  kRunning,
  kEnding,  ///< tearing down, backing off or done: ends are the teardown's business
};

/// Everything the decision about one task's end depends on.
struct EndFacts {
  // The job's settings.
  bool in_place = false;  ///< recovery in place (a dtrain-worker job with `in_place`)
  bool elastic = false;   ///< elastic membership (elastic.min_workers)
  bool slurm = false;     ///< Slurm job steps: Slurm can say whether a node is being taken away
  // The group.
  GroupPhase phase = GroupPhase::kRunning;
  bool stopping = false;         ///< the launcher was asked to stop
  bool group_finished = false;   ///< with this end, every task the success rule counts finished
  bool re_forming = false;       ///< a re-formation in place has not yet stepped on
  bool member_finished = false;  ///< a member has exited 0: it joins no re-formation
  bool others_train = false;     ///< another member runs
  // The task.
  TaskRole role = TaskRole::kTraining;
  bool away = false;  ///< out of the group (elastic): its host left
  /// It runs on a host or node of its own that can leave the group while the others run on (an
  /// ssh host or a Slurm node; this machine never leaves).
  bool host_can_leave = false;
  /// Why its host's members may not leave ("" when they may): fewer than elastic.min_workers
  /// would stay, or (for a command job) the chief is among them.
  std::string host_must_stay;
  // Its end.
  Outcome outcome = Outcome::kFailed;
  bool started = true;      ///< its process started (a remote start may fail)
  bool place_lost = false;  ///< its host or node was lost, now or earlier in this launch
  /// Exit 143 after the group agreed to stop and the chief saved: the others end the same way.
  bool saved_and_stopped = false;
  /// Its host is cut off: the freeze watch heard no word from it, or its agent was silent for
  /// FreezeWatch::kSilentSeconds when it ended.
  bool host_silent = false;
  /// Slurm's word on its node: the node's State when Slurm is taking it away, "" when it is not;
  /// unset until asked.
  std::optional<std::string> node_leaving;
  /// Its ends in a row, this one included, with no progress in between (its own or the group's).
  int silent_ends = 0;
  /// The restart book's answer to a replacement in place (RestartBook::decide_in_place, asked of a
  /// copy: counted only when the policy takes it).
  bool budget_allows = false;
  std::string budget_refusal;  ///< why not, when it does not
};

enum class EndAction {
  kNone,             ///< nothing for the group: a task finished and others run, or it is ending
  kAwayEnded,        ///< a process of a task out of the group ended (a joiner, or its last one)
  kRestartSpare,     ///< a spare ended: it is started again, never failing the job
  kSucceed,          ///< every task the success rule counts finished: the job ends succeeded
  kAbandonReform,    ///< a member finished while a re-formation was pending: the group restarts
  kAskSlurm,         ///< held until Slurm says whether the task's node is being taken away
  kShrink,           ///< its host leaves; the others re-form without it (in place)
  kReplace,          ///< a replacement joins the others, who re-form (in place)
  kLeaveAndRestart,  ///< its host leaves; the group restarts without it (an elastic command job)
  kRestartGroup,     ///< the whole group stops; the restart book says whether it starts again
};

/// Why an end that in place applied to takes the whole group's path.
enum class InPlaceRefusal {
  kNone,            ///< in place did not apply, or was taken
  kMemberFinished,  ///< a member has finished: the next generation could never form
  kCrashLoop,       ///< its second end in a row before the group made progress
  kBudget,          ///< the restart book refused (budget_refusal says why)
};

struct EndDecision {
  EndAction action = EndAction::kNone;
  InPlaceRefusal refusal = InPlaceRefusal::kNone;  ///< for kRestartGroup
  /// Its host was gone (or Slurm is taking its node) but its members could not leave:
  /// host_must_stay applied, and the end went on to the next path.
  bool host_kept = false;
  /// The decision took the restart book's in-place answer (kReplace, or kRestartGroup because the
  /// budget refused): the supervisor counts it in its book.
  bool counted_in_place = false;
  /// The decision passed the crash-loop rule (in place applied and the host stayed): the task's
  /// silent_ends stand as given.
  bool counts_silent_end = false;
};

/// Recovery in place applies to this end (before a finished member, its host, the crash loop and
/// the budget are looked at): the job is in place, running and not stopping, the task trains, the
/// end is not a configuration error, a non-finite loss or a group's agreed stop, and another
/// member runs.
bool in_place_applies(const EndFacts& f);
/// What to do about a task's end (docs/design.md#the-recovery-policy).
EndDecision decide_end(const EndFacts& f);

/// What the freeze watch's confirmed verdict calls for.
enum class FreezeAction {
  kKillMember,  ///< SIGKILL the member; its end takes decide_end's path, blamed as frozen
  kTearDown,    ///< nobody to blame (every member inside one collective): the group restarts
};
FreezeAction decide_freeze(bool verdict_names_member);

/// How a replacement in place starts, once the failed process's output has closed.
enum class ReplacementAction {
  kWait,     ///< its host is lost: the replacement waits out its back-off
  kPromote,  ///< a spare on its place is ready: it takes the place, no start and no data load
  kSpawn,    ///< a new process
  kNone,     ///< the group is going down meanwhile
};
ReplacementAction decide_replacement(bool group_running, bool backing_off, bool spare_ready);

const char* end_action_name(EndAction action);

}  // namespace dtrain::launcher
