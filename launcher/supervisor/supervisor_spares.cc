// See supervisor.h. Spares (docs/design.md#in-place-recovery): standby dtrain-workers started
// with the group, each holding a request to be promoted. When a training task fails in place, a
// spare that is ready takes its place: its child moves to the task's record (its output goes to
// the task's log from then on), its request is answered with the task's TF_CONFIG and the new
// generation, and a new spare starts in the background. No spare ready: a replacement is
// started, as without spares. A spare that dies is started again, never failing the group.
#include <spdlog/spdlog.h>

#include <csignal>

#include "common/clock.h"
#include "common/run_dir.h"
#include "launcher/plan/worker_env.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {

constexpr double kSpareRestartSeconds = 1;
constexpr int kSpareQuickEndsAllowed = 3;  ///< then a spare that dies at every start is left

}  // namespace

Supervisor::Task* Supervisor::ready_spare(const TaskPlan& of) {
  for (auto& task : tasks_) {
    const TaskPlan& p = task->plan;
    if (p.spare() && p.placement == of.placement && p.where == of.where &&
        task->state == Task::State::kSpareReady)
      return task.get();
  }
  return nullptr;
}

void Supervisor::on_spare_request(const std::string& request_json, ReformReplyFn reply) {
  guarded("spare request", [&] {
    std::optional<common::SpareRequest> request = common::parse_spare_request(request_json);
    auto refuse = [&](const std::string& error) {
      reply(common::format_spare_assignment({false, "", 0, "", error, ""}));
    };
    if (!request) return refuse("malformed spare request");
    if (phase_ == Phase::kRunning && on_join_request(request->spare, request->pid, reply)) return;
    Task* spare = nullptr;
    for (auto& task : tasks_)
      if (task->plan.spare() && task->plan.task.text() == request->spare) spare = task.get();
    // A remote spare names its pid on its host, which its agent reported when it started.
    if (!spare || !spare->child || request->pid != spare->child->worker_pid() || !spare->alive())
      return refuse(request->spare + " (pid " + std::to_string(request->pid) +
                    ") is not a spare of this launch");
    if (phase_ == Phase::kTearingDown || phase_ == Phase::kDone) return refuse("the job is ending");
    // Its newer request replaces the older one.
    spare->answer_held(common::format_spare_assignment({false, "", 0, "", "replaced", ""}));
    spare->held_reply = std::move(reply);
    spare->state = Task::State::kSpareReady;
    spare->spare_quick_ends = 0;
    spdlog::debug("{} (pid {}) is ready", request->spare, request->pid);
  });
}

// The spare's process becomes task's: no process start and no data load on the recovery's path.
void Supervisor::promote(Task& spare, Task& task) {
  if (guardian_ && task.child) guardian_->forget(task.pid);
  task.begin_run(std::move(spare.child), Task::State::kRunning, now(), generation_);
  task.remote_pid = spare.remote_pid;
  task.route = std::move(spare.route);
  *task.route = &task;
  task.output_open = spare.output_open;
  task.progress_path_now = spare.progress_path_now;
  std::string name = spare.plan.task.text();
  append_to_log(task, common::attempt_header(attempt_, task.plan.task, task.pid,
                                             common::utc_timestamp(), generation_) +
                          " (" + name + " promoted)\n");
  recorder_.event("promoted", [&](common::JsonWriter& w) {
    w.key("spare").value(name).key("task").value(task.plan.task.text());
    w.key("pid").value(task.pid).key("attempt").value(attempt_);
    w.key("generation").value(generation_);
  });
  spdlog::info("{} (pid {}) takes the place of {} in generation {}", name, task.pid,
               task.plan.task.text(), generation_);
  std::function<void(const std::string&)> reply = std::move(spare.held_reply);
  spare.held_reply = nullptr;
  spare.state = Task::State::kIdle;
  spare.pid = 0;
  spare.output_open = false;
  reply(common::format_spare_assignment({true, task.plan.task.text(), generation_,
                                         task_tf_config(plan_, task.plan, cluster_json_), "",
                                         elastic() ? members_text() : ""}));
  try {  // the next spare loads in the background; the job does not depend on it
    spawn_task(spare);
  } catch (const std::exception& e) {
    spdlog::warn("{}: cannot start a new spare: {}", name, e.what());
  }
}

// A spare that ended while the group runs is started again a second later, unless it keeps
// ending before it is ready (a spare never fails the job; it only stops being there).
void Supervisor::on_spare_end(Task& spare, const EndReading& end) {
  spare.held_reply = nullptr;
  if (stop_requested_) return;
  if (++spare.spare_quick_ends > kSpareQuickEndsAllowed) {
    spdlog::warn("{} ended {} times before it was ready ({}); no more spares of it",
                 spare.plan.task.text(), kSpareQuickEndsAllowed, end.what);
    return;
  }
  spdlog::warn("{} ended ({}); starting it again", spare.plan.task.text(), end.what);
  if (!spare.drain_timer) spare.drain_timer = clock_->make_timer();
  spare.drain_timer->expires_after(kSpareRestartSeconds);
  Task* s = &spare;
  spare.drain_timer->async_wait([this, s](const boost::system::error_code& ec) {
    if (ec || phase_ != Phase::kRunning || s->alive() || s->output_open) return;
    guarded("spare restart", [&] { spawn_task(*s); });
  });
}

void Supervisor::answer_spares(const std::string& error) {
  // Spares and an elastic job's joiners alike.
  for (auto& task : tasks_)
    task->answer_held(common::format_spare_assignment({false, "", 0, "", error, ""}));
}

}  // namespace dtrain::launcher
