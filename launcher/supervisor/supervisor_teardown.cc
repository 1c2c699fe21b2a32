// See supervisor.h. The end of an attempt: teardown (SIGTERM to every group at once, one shared
// grace period, SIGKILL), the restart decision and back-off, a stop asked for by a signal, the
// watchdog, and the end of the job.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <string>

#include "common/clock.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/run_dir.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {}  // namespace

void Supervisor::begin_teardown(const std::string& reason) {
  if (phase_ == Phase::kTearingDown || phase_ == Phase::kDone) return;
  settle_held_ends();  // no end waits for Slurm's answer once the group stops
  phase_ = Phase::kTearingDown;
  watchdog_timer_->cancel();
  freeze_timer_->cancel();
  answer_held_reforms(false, "the group is being stopped: " + reason);
  answer_spares("the job is ending: " + reason);
  recorder_.event("teardown", [&](common::JsonWriter& w) {
    w.key("attempt").value(attempt_).key("reason").value(reason);
  });
  signal_all(SIGTERM);
  teardown_started_ = now();
  grace_extended_ = false;
  grace_timer_->expires_after(plan_.spec().restart.grace_seconds);
  grace_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    guarded("grace timer", [this] { grace_expired(); });
  });
  write_state();
  maybe_teardown_complete();
}

const Supervisor::Task* Supervisor::saving_task() const {
  for (const auto& task : tasks_) {
    if (!task->plan.trains() || !task->child || task->plan.progress_path.empty() ||
        task->state != Task::State::kRunning)
      continue;
    std::optional<common::ProgressSample> r = task->child->look(task->progress_path_now).record;
    if (r && r->phase == common::ProgressPhase::kSaving) return task.get();
  }
  return nullptr;
}

void Supervisor::grace_expired() {
  if (phase_ != Phase::kTearingDown) return kill_now();
  const double grace = plan_.spec().restart.grace_seconds;
  const double bound = std::max(kSaveGraceFloorSeconds, kSaveGraceFactor * grace);
  const double waited = now() - teardown_started_;
  const Task* saving = waited < bound ? saving_task() : nullptr;
  if (!saving) return kill_now();
  if (!grace_extended_) {
    grace_extended_ = true;
    spdlog::info(
        "{} is writing a checkpoint: the grace period ({:g} s) is extended while it saves, up to "
        "{:g} s in all",
        saving->plan.task.text(), grace, bound);
    recorder_.event("grace_extended", [&](common::JsonWriter& w) {
      w.key("task").value(saving->plan.task.text()).key("bound_seconds").value(bound);
    });
  }
  grace_timer_->expires_after(std::min(0.25, bound - waited));
  grace_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    guarded("grace timer", [this] { grace_expired(); });
  });
}

// A dtrain-worker chief that ends 143 after a stop saved a checkpoint at the step the group
// agreed on (its record's last global step); one killed saved nothing at the stop.
std::string Supervisor::stop_outcome() const {
  if (!plan_.spec().command.empty()) return "stopped by a signal";
  for (const auto& task : tasks_) {
    if (!task->plan.trains() || task->plan.rank != 0) continue;
    if (task->status && !task->status->signaled && task->status->code == common::kExitPreempted) {
      std::optional<common::ProgressSample> r;
      if (task->child) r = task->child->look(task->progress_path_now).record;
      return r ? fmt::format("stopped by a signal; the chief saved a checkpoint at global step {}",
                             r->global_step)
               : std::string("stopped by a signal; the chief saved a checkpoint");
    }
    if (task->status && task->status->signaled)
      return fmt::format(
          "stopped by a signal; the chief was killed ({}) before it saved, so no checkpoint was "
          "written at the stop: a launch again resumes from the newest earlier one",
          signal_name(task->status->signal));
  }
  return "stopped by a signal";
}

// Sends sig to every group that may still hold a process: running workers, and exited ones
// whose output is still open (a grandchild holds it).
void Supervisor::signal_all(int sig) {
  for (auto& task : tasks_)
    if (task->holds_group()) task->child->signal_group(sig);
  recorder_.event("signal", [&](common::JsonWriter& w) {
    w.key("signal").value(signal_name(sig)).key("attempt").value(attempt_);
  });
}

void Supervisor::kill_now() {
  guarded("kill", [&] {
    if (phase_ != Phase::kTearingDown && phase_ != Phase::kRunning && phase_ != Phase::kStarting)
      return;
    signal_all(SIGKILL);
    // After SIGKILL, output closes at once unless something outside the group holds the pipe.
    grace_timer_->expires_after(options_.kill_drain_seconds);
    grace_timer_->async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      guarded("drain timer", [this] {
        for (auto& task : tasks_) {
          if (task->alive() && task->child) give_up_unkillable(*task);
          if (task->output_open)
            spdlog::warn("{}: output still open after SIGKILL; giving up on it",
                         task->plan.task.text());
          task->output_open = false;
        }
        maybe_teardown_complete();
      });
    });
    if (phase_ != Phase::kTearingDown) begin_teardown("killed");
  });
}

// A worker still there kill_drain_seconds after SIGKILL cannot be killed now (issue 43): the
// teardown names it and why, and goes on without it rather than wait for ever. It dies of the
// SIGKILL it holds once it can (a frozen cgroup thawed).
void Supervisor::give_up_unkillable(Task& task) {
  const std::string why =
      task.child ? task.child->why_unkillable() : "its end was not seen (it may be gone)";
  spdlog::error(
      "{} (pid {}) cannot be killed: it is still there {:g} s after SIGKILL: {}; the launcher "
      "goes on without it, and it ends by the SIGKILL it holds once it can run",
      task.plan.task.text(), task.pid, options_.kill_drain_seconds, why);
  recorder_.event("unkillable", [&](common::JsonWriter& w) {
    w.key("task").value(task.plan.task.text()).key("pid").value(task.pid);
    w.key("attempt").value(attempt_).key("why").value(why);
  });
  task.ended();
}

void Supervisor::maybe_teardown_complete() {
  if (phase_ != Phase::kTearingDown) return;
  for (const auto& task : tasks_)
    if (task->holds_group()) return;
  teardown_complete();
}

void Supervisor::teardown_complete() {
  grace_timer_->cancel();
  const std::string stopped = stop_requested_ ? stop_outcome() : "";  // reads the records
  for (auto& task : tasks_) {
    if (guardian_ && task->child) guardian_->forget(task->pid);
    task->child.reset();
  }
  if (fault_) return finish(common::kStatusFailed, common::kExitFailure, "launcher: " + *fault_);
  // Training that finished before a stop arrived (the evaluator still being stopped, say) has
  // succeeded: its model is written, and a launch again would have nothing to do.
  if (success_)
    return finish(common::kStatusSucceeded, common::kExitSuccess, "every training task finished");
  if (stop_requested_) return finish(common::kStatusStopped, common::kExitPreempted, stopped);
  if (membership_restart_) return restart_for_membership();
  DT_ENFORCE(first_failure_.has_value(), "a group stopped with neither success nor a failure");
  blame_disk_full();
  double ran = now() - attempt_started_;
  // A group that ran startup_seconds counts as started; one whose task never started did not
  // progress, whatever the others did. A lost host is no configuration problem: the group backs
  // off and tries again within the restart budget (docs/design.md#restart-policy).
  const FailureReport& f = *first_failure_;
  bool started = attempt_made_progress_ || ran >= plan_.spec().restart.startup_seconds;
  bool progressed = f.place_lost || (!f.never_started && started);
  Decision decision =
      book_.decide({f.outcome, progressed, ran, f.sigkill, f.never_started && !f.place_lost});
  if (!decision.restart)
    return finish(common::kStatusFailed, first_failure_->exit_code, decision.reason);
  back_off(decision);
}

void Supervisor::back_off(const Decision& decision) {
  phase_ = Phase::kBackingOff;
  recovering_ = true;
  recorder_.event("restart", [&](common::JsonWriter& w) {
    w.key("attempt")
        .value(attempt_ + 1)
        .key("delay_seconds")
        .value(decision.delay_seconds)
        .key("after")
        .value(outcome_name(first_failure_->outcome))
        .key("restarts")
        .value(book_.restarts())
        .key("preemptions")
        .value(book_.preemptions())
        .key("reached_step")
        .value(reached_step_);
  });
  spdlog::info(
      "restarting the group in {:.2f} s (attempt {}; {} failure restart(s), {} preemption(s))",
      decision.delay_seconds, attempt_ + 1, book_.restarts(), book_.preemptions());
  write_state();
  backoff_timer_->expires_after(decision.delay_seconds);
  backoff_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec || phase_ != Phase::kBackingOff) return;
    guarded("back-off timer", [this] {
      ++attempt_;
      start_attempt();
    });
  });
}

void Supervisor::stop(int signal) {
  guarded("stop", [&] {
    recorder_.event("launcher_signal",
                    [&](common::JsonWriter& w) { w.key("signal").value(signal_name(signal)); });
    if (stop_requested_) return;
    stop_requested_ = true;
    answer_sigterm_queries(true);  // the workers' SIGTERMs were this stop's
    switch (phase_) {
      case Phase::kBackingOff:
        backoff_timer_->cancel();
        return finish(common::kStatusStopped, common::kExitPreempted, "stopped by a signal");
      case Phase::kStarting:
      case Phase::kRunning:
        return begin_teardown(fmt::format("launcher got {}", signal_name(signal)));
      case Phase::kTearingDown:
      case Phase::kDone:
        return;
    }
  });
}

void Supervisor::cancel_timers() noexcept {
  for (auto* timer : {&backoff_timer_, &grace_timer_, &watchdog_timer_, &port_timer_,
                      &reform_timer_, &freeze_timer_})
    (*timer)->cancel();
  if (discovery_timer_) discovery_timer_->cancel();
  for (auto& [host, timer] : rejoin_timers_)
    if (timer) timer->cancel();
}

void Supervisor::finish(const std::string& status, int exit_code, const std::string& reason) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  cancel_timers();
  if (discovery_.running) discovery_.child->signal_group(SIGKILL);
  for (auto& [host, probe] : probes_)
    if (probe.running && probe.child) probe.child->signal_group(SIGKILL);
  for (auto& [node, question] : node_questions_)
    if (question.run.running && question.run.child) question.run.child->signal_group(SIGKILL);
  answer_held_reforms(false, "the job has ended: " + reason);
  answer_sigterm_queries(false);
  std::vector<Recovery> recoveries = std::move(result_.recoveries);
  result_ = SupervisorResult{status, exit_code, reason, first_failure_, std::move(recoveries)};
  if (status == common::kStatusSucceeded) result_.failure.reset();
  recorder_.release_reserve();  // the workers are gone: the last records may use it
  recorder_.event("end", [&](common::JsonWriter& w) {
    w.key("status").value(status).key("exit_code").value(exit_code).key("reason").value(reason);
  });
  write_state();
  if (on_done_) on_done_(result_);
}

void Supervisor::arm_watchdog() {
  std::optional<double> hang = plan_.spec().hang_timeout_seconds;
  if (!hang) return;
  watchdog_timer_->expires_after(std::min(1.0, *hang / 4));
  watchdog_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("watchdog", [this] { check_watchdog(); });
  });
}

// A training task silent for hang_timeout_seconds fails the group. Its peers wait for it in the
// all-reduce and fall silent too, so the one named is the one whose last sign of life is the
// oldest. An evaluator is not watched: the group never waits for it.
void Supervisor::check_watchdog() {
  if (phase_ != Phase::kRunning) return;
  double hang = *plan_.spec().hang_timeout_seconds;
  const double now = this->now();
  // Members waiting in a re-formation send nothing (docs/design.md#in-place-recovery): their
  // clocks start again, so a slow replacement is not blamed on a healthy survivor.
  if (re_forming(now)) {
    for (auto& task : tasks_)
      if (member(*task)) task->last_progress = now;
    return arm_watchdog();
  }
  Task* silent = nullptr;
  for (auto& task : tasks_) {
    if (!task->alive() || !member(*task) || now - task->last_progress < hang) continue;
    if (!silent || task->last_progress < silent->last_progress) silent = task.get();
  }
  if (!silent) return arm_watchdog();
  std::string what = fmt::format("hung: no progress for {:.1f} s", now - silent->last_progress);
  spdlog::warn("{} {}", silent->plan.task.text(), what);
  recorder_.event("hang", [&](common::JsonWriter& w) {
    w.key("task").value(silent->plan.task.text()).key("attempt").value(attempt_);
  });
  fail_first(*silent, Outcome::kFailed, what, common::kExitFailure);
  begin_teardown(fmt::format("{} hung", silent->plan.task.text()));
}

}  // namespace dtrain::launcher
