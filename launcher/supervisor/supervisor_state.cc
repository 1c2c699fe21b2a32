// See supervisor.h. The group as the outside sees it: a snapshot, written to state.json on every
// change (a later launcher uses its pids to end stale workers), and the live line. The formats
// themselves are group_view's pure functions.
#include <fmt/format.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/run_dir.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {

const char* Supervisor::phase_name() const {
  switch (phase_) {
    case Phase::kStarting:
      return common::kStatusStarting;
    case Phase::kRunning:
      return common::kStatusRunning;
    case Phase::kTearingDown:
      return common::kStatusStopping;
    case Phase::kBackingOff:
      return common::kStatusBackingOff;
    case Phase::kDone:
      return result_.status.c_str();
  }
  return common::kStatusRunning;
}

GroupSnapshot Supervisor::snapshot() const {
  const double now = this->now();
  GroupSnapshot g;
  g.job = plan_.spec().job;
  g.run_dir = plan_.context.run_dir;
  g.launcher_pid = static_cast<int>(::getpid());
  g.status = phase_name();
  g.attempt = attempt_;
  g.restarts = book_.restarts();
  g.preemptions = book_.preemptions();
  g.generation = generation_;
  if (elastic()) {
    g.world_size = world_size();
    g.membership = membership_;
  }
  for (const Recovery& r : result_.recoveries) {
    g.steps_redone += r.steps_redone();
    g.in_place_recoveries += r.in_place ? 1 : 0;
  }
  g.uptime_seconds = now - launcher_started_;
  g.updated_at = common::utc_timestamp();
  if (phase_ == Phase::kDone) {
    g.reason = result_.reason;
    g.exit_code = result_.exit_code;
  }
  for (size_t i = 0; i < tasks_.size(); ++i) {
    const Task* task = tasks_[i].get();
    TaskSnapshot t;
    t.task = task->plan.task.text();
    t.address = i >= ports_.size() || ports_[i] == task->plan.endpoint.port
                    ? task->plan.address
                    : fmt::format("{}:{}", task->plan.endpoint.host, ports_[i]);
    t.log_path = task->plan.log_path;
    t.pid = task->pid;
    t.state = task->state_name();
    t.status = task->status;
    t.progress = task->progress;
    t.progress_age_seconds = now - task->last_progress;
    g.tasks.push_back(std::move(t));
  }
  g.straggler = straggler_watch_.look(g.tasks);
  if (first_failure_)
    g.failure = FailureSnapshot{first_failure_->task.text(), first_failure_->attempt,
                                first_failure_->what, first_failure_->outcome};
  return g;
}

void Supervisor::write_state() {
  last_state_write_ = now();
  recorder_.write_state(state_json(snapshot()));  // a failure is kept by the recorder: guarded()
}

// One line for the whole group, from the chief's progress, with the ETA from the step rate seen
// since this attempt's first report.
void Supervisor::update_live_view() {
  const double now = this->now();
  if (now - last_live_view_ < (console_.interactive() ? 0.2 : 10.0)) return;
  const Task* chief = acting_chief();
  for (const auto& task : tasks_) {
    if (task.get() != chief || !task->progress) continue;
    std::optional<int64_t> done = reported_step(*task->progress);
    if (!done) return;
    if (rate_origin_step_ < 0 || *done < rate_origin_step_)
      rate_origin_step_ = *done, rate_origin_time_ = now;
    double rate =
        now > rate_origin_time_ ? (*done - rate_origin_step_) / (now - rate_origin_time_) : 0;
    std::string line = live_line(attempt_, *task->progress, rate);
    if (line.empty()) return;
    last_live_view_ = now;
    console_.set_status(line);
  }
}

}  // namespace dtrain::launcher
