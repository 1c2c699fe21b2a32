// The supervisor's answer to its own faults: every Asio handler runs through guarded(), so an
// exception or a write that failed stops the group with a summary instead of escaping the loop;
// and on a full disk, the task that said so is the one the summary blames.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>

#include "common/exit_codes.h"
#include "common/run_dir.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {

template <class Lines>
bool says_disk_full(const Lines& lines) {
  return std::any_of(lines.begin(), lines.end(), [](const std::string& line) {
    return line.find("No space left on device") != std::string::npos;
  });
}

}  // namespace

void Supervisor::guarded(const char* handler, const std::function<void()>& body) noexcept {
  try {
    body();
  } catch (const std::exception& e) {
    on_fault(fmt::format("{} handler failed: {}", handler, e.what()));
  } catch (...) {
    on_fault(fmt::format("{} handler failed with an unknown exception", handler));
  }
  if (fault_) return;
  if (log_error_) return on_fault(*log_error_);
  if (recorder_.write_error()) on_fault(*recorder_.write_error());
}

void Supervisor::on_fault(const std::string& what) noexcept {
  try {
    if (!fault_) {
      fault_ = what;
      spdlog::error("launcher: {}: stopping the workers, no restart", what);
      recorder_.event("launcher_fault", [&](common::JsonWriter& w) { w.key("what").value(what); });
    }
    switch (phase_) {
      case Phase::kStarting:
      case Phase::kRunning:
        return begin_teardown("launcher: " + *fault_);
      case Phase::kBackingOff:
        return finish(common::kStatusFailed, common::kExitFailure, "launcher: " + *fault_);
      case Phase::kTearingDown:
        return maybe_teardown_complete();
      case Phase::kDone:
        return;
    }
  } catch (const std::exception& e) {
    emergency_stop(fmt::format("{}; then stopping the workers failed: {}", what, e.what()));
  } catch (...) {
    emergency_stop(what);
  }
}

void Supervisor::emergency_stop(const std::string& what) noexcept {
  spdlog::critical("launcher: {}: killing every worker", what);
  for (auto& task : tasks_) {
    try {
      if (task->child) task->child->signal_group(SIGKILL);
    } catch (...) {  // the next group must still be killed
    }
  }
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  cancel_timers();
  try {
    result_ = SupervisorResult{common::kStatusFailed, common::kExitFailure, "launcher: " + what,
                               first_failure_, std::move(result_.recoveries)};
    recorder_.release_reserve();
    write_state();
    if (on_done_) on_done_(result_);
  } catch (...) {  // nothing is left to tell: the loop's owner sees phase kDone
  }
}

FailureReport Supervisor::failure_of(const Task& task, Outcome outcome, const std::string& what,
                                     int exit_code) const {
  return FailureReport{task.plan.task,
                       attempt_,
                       outcome,
                       what,
                       exit_code,
                       task.plan.log_path,
                       {task.last_lines.begin(), task.last_lines.end()},
                       false,
                       false,
                       false};
}

void Supervisor::blame_disk_full() {
  if (!first_failure_ || says_disk_full(first_failure_->last_lines)) return;
  for (const auto& task : tasks_) {
    if (!task->status || classify(*task->status) == Outcome::kSuccess ||
        !says_disk_full(task->last_lines))
      continue;
    spdlog::info("{} says the disk is full: it, not {}, is named as the cause",
                 task->plan.task.text(), first_failure_->task.text());
    first_failure_ = failure_of(*task, classify(*task->status), describe(*task->status),
                                job_exit_code(*task->status));
    return;
  }
}

}  // namespace dtrain::launcher
