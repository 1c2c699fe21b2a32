// The recovery policy (docs/design.md#the-recovery-policy) as a table: each row is a task's end,
// the facts that make it that row, and the action the supervisor must take. The rows follow the
// design's table, in its order; a fact changed one at a time shows what each row depends on.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "launcher/supervisor/recovery_policy.h"

using namespace dtrain::launcher;

namespace {

// A training member's failed end in a running in-place job: another member runs, the budget
// allows a replacement. Each row changes what makes it that row.
EndFacts in_place_failure() {
  EndFacts f;
  f.in_place = true;
  f.phase = GroupPhase::kRunning;
  f.role = TaskRole::kTraining;
  f.outcome = Outcome::kFailed;
  f.others_train = true;
  f.silent_ends = 0;
  f.budget_allows = true;
  return f;
}

// The same end in an elastic in-place job, on an ssh host whose members may leave.
EndFacts elastic_failure() {
  EndFacts f = in_place_failure();
  f.elastic = true;
  f.host_can_leave = true;
  return f;
}

// An elastic command job's (no in place) member on a host of its own.
EndFacts command_failure() {
  EndFacts f;
  f.elastic = true;
  f.host_can_leave = true;
  f.role = TaskRole::kTraining;
  f.outcome = Outcome::kFailed;
  f.others_train = true;
  return f;
}

struct Row {
  const char* name;
  EndFacts facts;
  EndAction action;
  InPlaceRefusal refusal = InPlaceRefusal::kNone;
};

template <typename Change>
EndFacts with(EndFacts f, Change change) {
  change(f);
  return f;
}

}  // namespace

TEST_CASE("the recovery policy's table: each end takes its row's action") {
  const std::vector<Row> rows = {
      // 1. A process of a task out of the group: its host's business, never the group's.
      {"an away task's end", with(in_place_failure(), [](EndFacts& f) { f.away = true; }),
       EndAction::kAwayEnded},
      {"an away task's end while the group ends",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.away = true;
              f.phase = GroupPhase::kEnding;
            }),
       EndAction::kAwayEnded},
      // 2. The group is ending: the teardown counts the ends.
      {"an end during the teardown",
       with(in_place_failure(), [](EndFacts& f) { f.phase = GroupPhase::kEnding; }),
       EndAction::kNone},
      // 3. A spare never fails the job.
      {"a spare's crash", with(in_place_failure(), [](EndFacts& f) { f.role = TaskRole::kSpare; }),
       EndAction::kRestartSpare},
      {"a spare's exit 0",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.role = TaskRole::kSpare;
              f.outcome = Outcome::kSuccess;
            }),
       EndAction::kRestartSpare},
      // 4. Success.
      {"the last member finishes",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.outcome = Outcome::kSuccess;
              f.group_finished = true;
            }),
       EndAction::kSucceed},
      {"a member finishes, others run",
       with(in_place_failure(), [](EndFacts& f) { f.outcome = Outcome::kSuccess; }),
       EndAction::kNone},
      {"a member finishes while the group re-forms",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.outcome = Outcome::kSuccess;
              f.re_forming = true;
            }),
       EndAction::kAbandonReform},
      {"the evaluator finishes while the group re-forms",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.outcome = Outcome::kSuccess;
              f.re_forming = true;
              f.role = TaskRole::kOther;
            }),
       EndAction::kNone},
      // 5. In place: a member's failure, another member running.
      {"a member crashes", in_place_failure(), EndAction::kReplace},
      {"a member is preempted alone (SIGKILL)",
       with(in_place_failure(), [](EndFacts& f) { f.outcome = Outcome::kPreempted; }),
       EndAction::kReplace},
      {"a remote member's start fails (no elastic)",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.started = false;
              f.host_can_leave = true;
            }),
       EndAction::kReplace},
      {"a member's first silent end",
       with(in_place_failure(), [](EndFacts& f) { f.silent_ends = 1; }), EndAction::kReplace},
      {"a member's second end before any progress",
       with(in_place_failure(), [](EndFacts& f) { f.silent_ends = 2; }), EndAction::kRestartGroup,
       InPlaceRefusal::kCrashLoop},
      {"a start failure twice: the book's rule, not the loop's",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.silent_ends = 2;
              f.started = false;
            }),
       EndAction::kReplace},
      {"the budget is spent",
       with(in_place_failure(), [](EndFacts& f) { f.budget_allows = false; }),
       EndAction::kRestartGroup, InPlaceRefusal::kBudget},
      {"a member has finished: no generation can form",
       with(in_place_failure(), [](EndFacts& f) { f.member_finished = true; }),
       EndAction::kRestartGroup, InPlaceRefusal::kMemberFinished},
      // 6. In place does not apply: the whole group.
      {"the only member fails",
       with(in_place_failure(), [](EndFacts& f) { f.others_train = false; }),
       EndAction::kRestartGroup},
      {"a configuration error (exit 2)",
       with(in_place_failure(), [](EndFacts& f) { f.outcome = Outcome::kConfigError; }),
       EndAction::kRestartGroup},
      {"a non-finite loss (exit 4)",
       with(in_place_failure(), [](EndFacts& f) { f.outcome = Outcome::kNonFinite; }),
       EndAction::kRestartGroup},
      {"the group agreed to stop and saved (exit 143)",
       with(in_place_failure(),
            [](EndFacts& f) {
              f.outcome = Outcome::kPreempted;
              f.saved_and_stopped = true;
            }),
       EndAction::kRestartGroup},
      {"the launcher is stopping", with(in_place_failure(), [](EndFacts& f) { f.stopping = true; }),
       EndAction::kRestartGroup},
      {"an end while the group starts",
       with(in_place_failure(), [](EndFacts& f) { f.phase = GroupPhase::kStarting; }),
       EndAction::kRestartGroup},
      {"the evaluator fails",
       with(in_place_failure(), [](EndFacts& f) { f.role = TaskRole::kOther; }),
       EndAction::kRestartGroup},
      {"no in place: a member fails",
       with(in_place_failure(), [](EndFacts& f) { f.in_place = false; }), EndAction::kRestartGroup},
      // 7. Elastic, in place: a host that is gone leaves; one that is there is replaced on.
      {"elastic: a member fails on a host that is there", elastic_failure(), EndAction::kReplace},
      {"elastic: a member's host is lost",
       with(elastic_failure(), [](EndFacts& f) { f.place_lost = true; }), EndAction::kShrink},
      {"elastic: a member's host cannot start it",
       with(elastic_failure(), [](EndFacts& f) { f.started = false; }), EndAction::kShrink},
      {"elastic: the freeze watch heard nothing from its host",
       with(elastic_failure(), [](EndFacts& f) { f.host_silent = true; }), EndAction::kShrink},
      {"elastic: a lost host whose members must stay is replaced on",
       with(elastic_failure(),
            [](EndFacts& f) {
              f.place_lost = true;
              f.host_must_stay = "below elastic.min_workers";
            }),
       EndAction::kReplace},
      {"elastic: a member on this machine never leaves",
       with(elastic_failure(),
            [](EndFacts& f) {
              f.place_lost = true;
              f.host_can_leave = false;
            }),
       EndAction::kReplace},
      {"elastic under Slurm: a failure on a node Slurm has not spoken of",
       with(elastic_failure(), [](EndFacts& f) { f.slurm = true; }), EndAction::kAskSlurm},
      {"elastic under Slurm: the node is being drained",
       with(elastic_failure(),
            [](EndFacts& f) {
              f.slurm = true;
              f.node_leaving = "DRAINING";
            }),
       EndAction::kShrink},
      {"elastic under Slurm: the node is usable",
       with(elastic_failure(),
            [](EndFacts& f) {
              f.slurm = true;
              f.node_leaving = "";
            }),
       EndAction::kReplace},
      {"elastic under Slurm: a lost node needs no question",
       with(elastic_failure(),
            [](EndFacts& f) {
              f.slurm = true;
              f.place_lost = true;
            }),
       EndAction::kShrink},
      {"elastic: a crash loop on a host that is there",
       with(elastic_failure(), [](EndFacts& f) { f.silent_ends = 2; }), EndAction::kRestartGroup,
       InPlaceRefusal::kCrashLoop},
      // 8. Elastic command jobs (no in place): a host that is gone restarts the group without it.
      {"command: a member's host is lost",
       with(command_failure(), [](EndFacts& f) { f.place_lost = true; }),
       EndAction::kLeaveAndRestart},
      {"command: a member's start fails",
       with(command_failure(), [](EndFacts& f) { f.started = false; }),
       EndAction::kLeaveAndRestart},
      {"command: a member crashes on a host that is there", command_failure(),
       EndAction::kRestartGroup},
      {"command: a silent agent is no reason (no freeze watch)",
       with(command_failure(), [](EndFacts& f) { f.host_silent = true; }),
       EndAction::kRestartGroup},
      {"command: the chief's host is lost",
       with(command_failure(),
            [](EndFacts& f) {
              f.place_lost = true;
              f.host_must_stay = "the chief";
            }),
       EndAction::kRestartGroup},
      {"command under Slurm: ask first",
       with(command_failure(), [](EndFacts& f) { f.slurm = true; }), EndAction::kAskSlurm},
      {"command under Slurm: the node is down",
       with(command_failure(),
            [](EndFacts& f) {
              f.slurm = true;
              f.node_leaving = "DOWN";
            }),
       EndAction::kLeaveAndRestart},
      {"command: the launcher is stopping",
       with(command_failure(),
            [](EndFacts& f) {
              f.place_lost = true;
              f.stopping = true;
            }),
       EndAction::kRestartGroup},
  };
  for (const Row& row : rows) {
    INFO(row.name);
    const EndDecision d = decide_end(row.facts);
    CHECK(std::string(end_action_name(d.action)) == end_action_name(row.action));
    CHECK(static_cast<int>(d.refusal) == static_cast<int>(row.refusal));
  }
}

TEST_CASE("the recovery policy says what it counted: the crash-loop rule and the budget") {
  // Taken: both counted.
  EndDecision d = decide_end(in_place_failure());
  CHECK(d.counts_silent_end);
  CHECK(d.counted_in_place);
  // Refused by the budget: its answer counts (as the whole-group path's will).
  d = decide_end(with(in_place_failure(), [](EndFacts& f) { f.budget_allows = false; }));
  CHECK(d.counted_in_place);
  // A crash loop stops before the budget is asked.
  d = decide_end(with(in_place_failure(), [](EndFacts& f) { f.silent_ends = 2; }));
  CHECK(d.counts_silent_end);
  CHECK_FALSE(d.counted_in_place);
  // A shrink or a question to Slurm counts neither: the end is not a replacement's.
  d = decide_end(with(elastic_failure(), [](EndFacts& f) { f.place_lost = true; }));
  CHECK_FALSE(d.counts_silent_end);
  CHECK_FALSE(d.counted_in_place);
  d = decide_end(with(elastic_failure(), [](EndFacts& f) { f.slurm = true; }));
  CHECK_FALSE(d.counts_silent_end);
  CHECK_FALSE(d.counted_in_place);
  // Its host was gone but had to stay: said, and the end went on.
  d = decide_end(with(elastic_failure(), [](EndFacts& f) {
    f.place_lost = true;
    f.host_must_stay = "the chief";
  }));
  CHECK(d.host_kept);
  CHECK(d.action == EndAction::kReplace);
  CHECK_FALSE(in_place_applies(with(in_place_failure(), [](EndFacts& f) { f.stopping = true; })));
}

TEST_CASE("the freeze verdict and the replacement's start are the policy's too") {
  CHECK(decide_freeze(true) == FreezeAction::kKillMember);
  CHECK(decide_freeze(false) == FreezeAction::kTearDown);
  // group running, backing off, spare ready
  CHECK(decide_replacement(true, true, true) == ReplacementAction::kWait);
  CHECK(decide_replacement(true, false, true) == ReplacementAction::kPromote);
  CHECK(decide_replacement(true, false, false) == ReplacementAction::kSpawn);
  CHECK(decide_replacement(false, true, true) == ReplacementAction::kNone);
  CHECK(decide_replacement(false, false, false) == ReplacementAction::kNone);
}
