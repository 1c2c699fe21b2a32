// See supervisor.h. Frozen members (docs/design.md#frozen-workers): every half second while the
// group runs, what each dtrain-worker training task's child shows of its progress record and
// process (read here, or reported by its agent) goes to a FreezeWatch. Its first verdict on a
// stall is a warning (event `stall`); one that persists names a member, which is SIGKILLed and
// whose end takes the usual path (in place, or the whole group), blamed as frozen, or finds a
// group stuck with nobody to blame, which is torn down. `freeze_seconds: 0` turns it off.
#include <spdlog/spdlog.h>

#include <csignal>

#include "common/clock.h"
#include "common/exit_codes.h"
#include "launcher/supervisor/recovery_policy.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {

constexpr double kFreezeLookSeconds = 0.5;

}  // namespace

bool Supervisor::watches_freezes() const {
  if (plan_.spec().freeze_seconds <= 0) return false;
  for (const auto& task : tasks_)
    if (task->plan.trains() && !task->plan.progress_path.empty()) return true;
  return false;
}

// A member whose record shows an older generation than the group's newest was started (or was
// re-forming) before that generation was made, when it had no record to be told by: a
// replacement started for generation 1 while a second failure made generation 2 would wait in a
// rendezvous that can no longer form. It gets the notice now, once per generation.
void Supervisor::notice_late_members() {
  if (generation_ == 0) return;
  for (auto& task : tasks_) {
    if (!member(*task) || task->plan.progress_path.empty() || !task->child ||
        task->state != Task::State::kRunning || task->noticed >= generation_)
      continue;
    std::optional<common::ProgressSample> r = task->child->look(task->progress_path_now).record;
    if (!r || r->generation >= generation_) continue;
    spdlog::info("{} is at generation {}; telling it the group re-forms as {}",
                 task->plan.task.text(), r->generation, generation_);
    task->child->queue_signal(SIGUSR1, generation_);
    task->noticed = generation_;
  }
}

void Supervisor::arm_freeze_watch() {
  if (!watches_freezes()) return;
  freeze_timer_->expires_after(kFreezeLookSeconds);
  freeze_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("freeze watch", [this] { look_for_freezes(); });
  });
}

// A first verdict: said and recorded, nothing done; the watch confirms it only if it persists
// (a member short of CPU, a slow disk or a debugger's pause usually move on before that).
void Supervisor::warn_of_stall(const FreezeVerdict& verdict, const Task* suspect) {
  const std::string who =
      suspect ? fmt::format("{} ({})", suspect->plan.task.text(), suspect->plan.place_text())
              : std::string("the group");
  spdlog::warn(
      "{} may be frozen: {}; {:.1f} s without progress (bound {:.1f} s); killed if it lasts "
      "past {:.1f} s",
      who, verdict.why, verdict.stalled_seconds, verdict.bound_seconds,
      FreezeWatch::kConfirmFactor * verdict.bound_seconds);
  recorder_.event("stall", [&](common::JsonWriter& w) {
    if (suspect) w.key("task").value(suspect->plan.task.text()).key("pid").value(suspect->pid);
    w.key("attempt").value(attempt_).key("why").value(verdict.why);
    w.key("stalled_seconds").value(verdict.stalled_seconds);
    w.key("bound_seconds").value(verdict.bound_seconds);
  });
}

void Supervisor::look_for_freezes() {
  if (phase_ != Phase::kRunning) return;
  notice_late_members();
  std::vector<Task*> members;
  std::vector<MemberObservation> looks;
  for (auto& task : tasks_) {
    if (!member(*task) || task->plan.progress_path.empty()) continue;
    if (task->state != Task::State::kRunning) {  // a member is missing (replaced, starting)
      freeze_.reset();
      return arm_freeze_watch();
    }
    members.push_back(task.get());
    looks.push_back(task->child->look(task->progress_path_now));
  }
  std::optional<FreezeVerdict> verdict = freeze_.observe(now(), looks);
  if (!verdict) return arm_freeze_watch();
  if (!verdict->confirmed) {
    warn_of_stall(*verdict, verdict->member ? members[*verdict->member] : nullptr);
    return arm_freeze_watch();
  }
  if (decide_freeze(verdict->member.has_value()) == FreezeAction::kTearDown) {
    // Every member waits inside one collective: a link is down, and nobody is to blame.
    Task& first = *members.front();
    std::string what = fmt::format("frozen group: {}", verdict->why);
    spdlog::warn("{} (bound {:.1f} s)", what, verdict->bound_seconds);
    recorder_.event("frozen", [&](common::JsonWriter& w) {
      w.key("attempt").value(attempt_).key("why").value(verdict->why);
      w.key("stalled_seconds").value(verdict->stalled_seconds);
      w.key("bound_seconds").value(verdict->bound_seconds);
    });
    fail_first(first, Outcome::kFailed, what, common::kExitFailure);
    return begin_teardown(what);
  }
  Task& frozen = *members[*verdict->member];
  frozen.frozen = *verdict;
  spdlog::warn(
      "{} ({}) is frozen: {}; the group made no progress for {:.1f} s (bound {:.1f} s): "
      "SIGKILL",
      frozen.plan.task.text(), frozen.plan.place_text(), verdict->why, verdict->stalled_seconds,
      verdict->bound_seconds);
  recorder_.event("frozen", [&](common::JsonWriter& w) {
    w.key("task").value(frozen.plan.task.text()).key("attempt").value(attempt_);
    w.key("place").value(frozen.plan.place_text());
    w.key("pid").value(frozen.pid);
    // The worker's own pid, as it wrote it in its record (pid is the launcher's child: for a
    // remote worker, the remote shell).
    const std::optional<common::ProgressSample>& r = looks[*verdict->member].record;
    if (r) w.key("worker_pid").value(r->pid);
    w.key("why").value(verdict->why);
    w.key("stalled_seconds").value(verdict->stalled_seconds);
    w.key("bound_seconds").value(verdict->bound_seconds);
  });
  frozen.child->signal_group(SIGKILL);
  arm_freeze_watch();
}

}  // namespace dtrain::launcher
