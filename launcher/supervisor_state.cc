// state.json: the supervisor's state for `dtrain status` and for a later launcher, which uses the
// recorded pids to end stale workers. Written whole and atomically on every change.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "launcher/supervisor.h"
#include "launcher/supervisor_slot.h"

namespace dtrain::launcher {
namespace {

void write_progress(common::JsonWriter& w, const common::ControlMessage& p) {
  w.key("last_progress").begin_object();
  if (p.epoch) w.key("epoch").value(*p.epoch);
  if (p.epochs) w.key("epochs").value(*p.epochs);
  if (p.step) w.key("step").value(*p.step);
  if (p.steps) w.key("steps").value(*p.steps);
  if (p.loss) w.key("loss").value(*p.loss);
  if (p.accuracy) w.key("accuracy").value(*p.accuracy);
  if (p.samples_per_second) w.key("samples_per_second").value(*p.samples_per_second);
  w.end_object();
}

}  // namespace

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

void Supervisor::write_state() {
  last_state_write_ = common::monotonic_seconds();
  recorder_.write_state(state_json());  // a failure is kept by the recorder: see guarded()
}

std::string Supervisor::state_json() const {
  double now = common::monotonic_seconds();
  common::JsonWriter w;
  w.begin_object()
      .key("job")
      .value(options_.context.spec->job)
      .key("run_dir")
      .value(options_.context.run_dir)
      .key("launcher_pid")
      .value(static_cast<int>(::getpid()))
      .key("status")
      .value(phase_name())
      .key("attempt")
      .value(attempt_)
      .key("restarts")
      .value(book_.restarts())
      .key("preemptions")
      .value(book_.preemptions())
      .key("uptime_seconds")
      .value(now - launcher_started_)
      .key("updated_at")
      .value(common::utc_timestamp());
  if (phase_ == Phase::kDone)
    w.key("reason").value(result_.reason).key("exit_code").value(result_.exit_code);
  w.key("workers").begin_array();
  for (const auto& slot : slots_) {
    w.begin_object()
        .key("task")
        .value(slot->task.text())
        .key("address")
        .value(slot->address)
        .key("log")
        .value(slot->log_path)
        .key("pid")
        .value(slot->pid)
        .key("state")
        .value(slot->pid == 0 ? "not started"
               : slot->exited ? "exited"
                              : "running");
    if (slot->status)
      w.key("exit")
          .value(describe(*slot->status))
          .key("outcome")
          .value(outcome_name(classify(*slot->status)));
    if (slot->progress) write_progress(w, *slot->progress);
    if (slot->pid != 0) w.key("progress_age_seconds").value(now - slot->last_progress);
    w.end_object();
  }
  w.end_array();
  if (first_failure_) {
    w.key("failure")
        .begin_object()
        .key("task")
        .value(first_failure_->task.text())
        .key("attempt")
        .value(first_failure_->attempt)
        .key("what")
        .value(first_failure_->what)
        .key("outcome")
        .value(outcome_name(first_failure_->outcome))
        .end_object();
  }
  return w.end_object().str();
}

std::string Supervisor::prometheus_text() const {
  std::string job = common::json_quote(options_.context.spec->job);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP dtrain_{} {}\n# TYPE dtrain_{} {}\n", name, help, name, type);
  };
  metric("restarts_total", "counter", "Group restarts after failures.");
  out += fmt::format("dtrain_restarts_total{{job={}}} {}\n", job, book_.restarts());
  metric("preemptions_total", "counter", "Group restarts after preemptions.");
  out += fmt::format("dtrain_preemptions_total{{job={}}} {}\n", job, book_.preemptions());
  metric("attempt", "gauge", "Current attempt of the group (DTRAIN_ATTEMPT).");
  out += fmt::format("dtrain_attempt{{job={}}} {}\n", job, attempt_);
  metric("worker_up", "gauge", "1 while the worker process runs.");
  for (const auto& slot : slots_) {
    out += fmt::format("dtrain_worker_up{{job={},task=\"{}\"}} {}\n", job, slot->task.text(),
                       slot->exited ? 0 : 1);
  }
  metric("worker_loss", "gauge",
         "Running mean loss of the current epoch, as the worker last reported it.");
  metric("worker_samples_per_second", "gauge",
         "Training samples per second the worker last reported.");
  metric("worker_global_step", "gauge", "Steps the worker reports done (epoch * steps + step).");
  for (const auto& slot : slots_) {
    if (!slot->progress) continue;
    const common::ControlMessage& p = *slot->progress;
    std::string labels = fmt::format("job={},task=\"{}\"", job, slot->task.text());
    if (p.loss) out += fmt::format("dtrain_worker_loss{{{}}} {}\n", labels, *p.loss);
    if (p.samples_per_second)
      out +=
          fmt::format("dtrain_worker_samples_per_second{{{}}} {}\n", labels, *p.samples_per_second);
    if (p.epoch && p.steps && p.step) {
      out += fmt::format("dtrain_worker_global_step{{{}}} {}\n", labels,
                         int64_t{*p.epoch - 1} * *p.steps + *p.step);
    }
  }
  return out;
}

}  // namespace dtrain::launcher
