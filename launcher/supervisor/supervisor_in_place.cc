// See supervisor.h. Recovery in place (docs/design.md#in-place-recovery): a training task's failed
// end while other training tasks run makes the attempt's next generation and starts a replacement
// for that task alone; the survivors' reform requests are answered with that generation. What the
// workers do to re-form (undo, rendezvous, agreement) is theirs; this file only decides, spawns
// and answers. Anything it cannot explain takes the whole-group path of supervisor_teardown.cc.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>

#include "common/clock.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/json.h"
#include "launcher/supervisor/recovery_policy.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {

std::string refusal(const std::string& error) {
  return common::format_reform_reply({false, 0, error, ""});
}

}  // namespace

bool Supervisor::others_train(const Task& task) const {
  for (const auto& other : tasks_)
    if (other.get() != &task && member(*other) && other->alive()) return true;
  return false;
}

const Supervisor::Task* Supervisor::finished_member() const {
  for (const auto& other : tasks_)
    if (member(*other) && other->status && classify(*other->status) == Outcome::kSuccess)
      return other.get();
  return nullptr;
}

// The policy's kReplace: the others re-form as the next generation, and a replacement (a spare,
// or a new process once what is left of the old one is gone) joins them.
void Supervisor::replace_in_place(Task& task, const EndReading& reading, double delay_seconds) {
  ++generation_;
  recorder_.event("in_place", [&](common::JsonWriter& w) {
    w.key("task").value(task.plan.task.text()).key("attempt").value(attempt_);
    w.key("generation").value(generation_).key("outcome").value(outcome_name(reading.outcome));
    w.key("what").value(reading.what);
    if (delay_seconds > 0) w.key("delay_seconds").value(delay_seconds);
  });
  spdlog::info("{}: starting a replacement{}; the others re-form as generation {} of attempt {}",
               task.plan.task.text(),
               delay_seconds > 0
                   ? fmt::format(" in {:.2f} s ({} is lost)", delay_seconds, task.plan.place_text())
                   : "",
               generation_, attempt_);
  // A failure while the last one is still being recovered from extends that recovery.
  double failed_at = in_place_recovery_ ? in_place_recovery_->failed_at : now();
  // Until the survivors' requests say what they held, the furthest step reported stands in.
  int64_t reached = in_place_recovery_ ? in_place_recovery_->reached_step : reform_furthest_;
  std::optional<FailureReport> cause =
      in_place_recovery_ ? in_place_recovery_->cause
                         : failure_of(task, reading.outcome, reading.what, reading.exit_code);
  in_place_recovery_ = PendingInPlace{generation_, failed_at, reached, std::nullopt, cause};
  task.state = Task::State::kReplacing;
  task.respawn_at = now() + delay_seconds;
  notify_members([&](const Task& t) { return &t == &task; });
  // What is left of the dead member's group (a grandchild holding its output) goes first; its
  // last output lines reach the log before the replacement's header.
  if (task.output_open)
    drain_then_respawn(task);
  else
    respawn(task);
  answer_held_reforms(true, "");
  write_state();
}

// SIGKILL to what is left of the group, then the replacement when its output closes, or after
// kill_drain_seconds if something outside the group holds the pipe (as a teardown gives up).
void Supervisor::drain_then_respawn(Task& task) {
  task.child->signal_group(SIGKILL);
  if (!task.drain_timer) task.drain_timer = clock_->make_timer();
  task.drain_timer->expires_after(options_.kill_drain_seconds);
  Task* t = &task;
  task.drain_timer->async_wait([this, t](const boost::system::error_code& ec) {
    if (ec || t->state != Task::State::kReplacing || phase_ != Phase::kRunning) return;
    guarded("drain timer", [&] {
      spdlog::warn("{}: output still open after SIGKILL; starting its replacement anyway",
                   t->plan.task.text());
      t->output_open = false;
      respawn(*t);
    });
  });
}

// The notice of docs/design.md#in-place-recovery: SIGUSR1 with the new generation to every
// other training worker, which leaves a collective of an older generation at once. A peer cut
// off by the network closes nothing, so without it a survivor would wait out its link time-out.
// Only workers whose progress record shows they run dtrain-worker's loop get it (the worker
// blocks SIGUSR1 before it writes one; before that, the signal would kill it).
void Supervisor::notify_members(const std::function<bool(const Task&)>& skip) {
  for (auto& other : tasks_) {
    if (!member(*other) || !other->child || other->state != Task::State::kRunning ||
        other->plan.progress_path.empty() || (skip && skip(*other)))
      continue;
    if (!other->child->look(other->progress_path_now).record) continue;
    other->child->queue_signal(SIGUSR1, generation_);
    other->noticed = generation_;
  }
}

// A member exited 0 while the group re-forms (the chief failed at its final save while the
// others finished): the finished member never joins the new generation's rendezvous, so the
// survivors would wait it out and the reform hold after it. The whole group restarts at once,
// blamed on the failure the re-formation was for.
void Supervisor::abandon_in_place(const Task& finished) {
  const PendingInPlace& pending = *in_place_recovery_;
  // One that re-formed (it was told to join this generation, or started in it) finished with
  // the group: the failure came at the very end, with nothing left to train.
  if (finished.reformed_to >= pending.generation || finished.generation >= pending.generation)
    return;
  std::string why = fmt::format("{} finished while generation {} was forming",
                                finished.plan.task.text(), pending.generation);
  spdlog::warn("{}: it cannot form; restarting the group", why);
  if (pending.cause)
    first_failure_ = first_failure_ ? first_failure_ : pending.cause;
  else  // an elastic re-formation has no failed end to blame
    fail_first(finished, Outcome::kFailed, why, common::kExitFailure);
  begin_teardown(pending.cause ? fmt::format("{} finished while {} was being replaced",
                                             finished.plan.task.text(), pending.cause->task.text())
                               : why);
}

void Supervisor::respawn(Task& task) {
  if (task.drain_timer) task.drain_timer->cancel();
  const double wait = task.respawn_at - now();
  // A spare of the task's own place (its address is there), on this machine or its ssh host.
  Task* spare = ready_spare(task.plan);
  switch (decide_replacement(phase_ == Phase::kRunning, wait > 0, spare != nullptr)) {
    case ReplacementAction::kWait: {  // a lost host's back-off: keep pending
      if (!task.respawn_timer) task.respawn_timer = clock_->make_timer();
      task.respawn_timer->expires_after(wait);
      Task* t = &task;
      task.respawn_timer->async_wait([this, t](const boost::system::error_code& ec) {
        if (ec || t->state != Task::State::kReplacing || t->output_open ||
            phase_ != Phase::kRunning)
          return;
        guarded("replacement back-off timer", [&] { respawn(*t); });
      });
      return;
    }
    case ReplacementAction::kNone:  // the group is going down meanwhile
      task.state = Task::State::kEnded;
      return;
    case ReplacementAction::kPromote:
      return promote(*spare, task);
    case ReplacementAction::kSpawn:
      break;
  }
  if (guardian_ && task.child) guardian_->forget(task.pid);
  task.child.reset();
  try {
    spawn_task(task);
  } catch (const common::ConfigError& e) {
    fail_first(task, Outcome::kConfigError, e.what(), common::kExitConfig);
    begin_teardown("a replacement could not be started");
  } catch (const common::IoError& e) {
    if (fail_first(task, Outcome::kFailed, e.what(), common::kExitFailure))
      first_failure_->never_started = true;
    begin_teardown("a replacement could not be started");
  }
}

bool Supervisor::replacement_starting() const {
  if (!in_place_recovery_) return false;
  const double now = this->now();
  for (const auto& t : tasks_) {
    if (!member(*t)) continue;
    if (t->state == Task::State::kReplacing) return true;
    if (t->alive() && !t->made_progress && t->generation >= in_place_recovery_->generation &&
        now - t->spawned_at < plan_.spec().restart.startup_seconds)
      return true;
  }
  return false;
}

bool Supervisor::re_forming(double now) const {
  if (!held_reforms_.empty()) return true;  // bounded by reform_hold_seconds
  if (!in_place_recovery_) return false;
  const common::RestartPolicy& restart = plan_.spec().restart;
  return now - in_place_recovery_->failed_at <
         restart.startup_seconds + plan_.spec().hang_timeout_seconds.value_or(0);
}

std::string Supervisor::join_reply(const std::string& task) {
  if (Task* t = training_task(task)) t->reformed_to = generation_;
  return common::format_reform_reply({true, generation_, "", members_text()});
}

Supervisor::Task* Supervisor::training_task(const std::string& name) {
  for (auto& task : tasks_)
    if (task->plan.trains() && task->plan.task.text() == name) return task.get();
  return nullptr;
}

void Supervisor::on_reform_request(const std::string& request_json, ReformReplyFn reply) {
  guarded("reform request", [&] {
    std::optional<common::ReformRequest> request = common::parse_reform_request(request_json);
    if (!request) return reply(refusal("malformed reform request"));
    if (!training_task(request->task))
      return reply(refusal(request->task + " is not a training task of this job"));
    if (!plan_.in_place) return reply(refusal("recovery in place is off for this launch"));
    if (request->attempt != attempt_ || phase_ != Phase::kRunning) {
      return reply(refusal(fmt::format("attempt {} is over or ending (the group is {}, attempt {})",
                                       request->attempt, phase_name(), attempt_)));
    }
    // What the worker held counts for the steps redone, whenever its request comes.
    reform_furthest_ =
        std::max(reform_furthest_, request->whole_step + (request->in_flight ? 1 : 0));
    if (in_place_recovery_) in_place_recovery_->reached_step = reform_furthest_;
    if (request->generation < generation_) return reply(join_reply(request->task));
    if (request->generation > generation_) {
      return reply(refusal(fmt::format("generation {} was never formed (the group is at {})",
                                       request->generation, generation_)));
    }
    // Its rendezvous for the current generation timed out while a replacement is still on its
    // way (a slow data load, a lost host's back-off): wait for it again, within startup_seconds.
    if (replacement_starting()) {
      spdlog::info("{}: generation {} is still forming (a replacement is starting); waiting again",
                   request->task, generation_);
      return reply(join_reply(request->task));
    }
    hold_reform(std::move(*request), std::move(reply));
  });
}

// A whole job's stop (systemctl stop, a kill of the process tree) signals the launcher and the
// workers together; a worker that took its SIGTERM for its own preemption would leave without
// saving (issue 43). It asks first, and the launcher waits a moment for its own stop.
void Supervisor::on_sigterm_query(const std::string& request_json, ReformReplyFn reply) {
  guarded("sigterm query", [&] {
    std::optional<common::SigtermQuery> query = common::parse_sigterm_query(request_json);
    if (!query || stop_requested_ || phase_ == Phase::kDone) {
      bool job_stop = query && stop_requested_;
      if (query)
        spdlog::info(
            "{}: SIGTERM from pid {}: {}", query->task, query->sender,
            job_stop ? "the job is stopping; it saves with the group" : "the job has ended");
      return reply(common::format_sigterm_answer(job_stop));
    }
    auto question = std::make_shared<SigtermQuestion>();
    question->task = query->task;
    question->sender = query->sender;
    question->reply = std::move(reply);
    question->timer = clock_->make_timer();
    question->timer->expires_after(options_.sigterm_confirm_seconds);
    std::weak_ptr<SigtermQuestion> weak = question;
    question->timer->async_wait([this, weak](const boost::system::error_code& ec) {
      std::shared_ptr<SigtermQuestion> q = weak.lock();
      if (ec || !q) return;
      guarded("sigterm question", [&] {
        auto& held = sigterm_questions_;
        held.erase(std::remove(held.begin(), held.end(), q), held.end());
        spdlog::info("{}: SIGTERM from pid {} preempts it alone (the launcher is not stopping)",
                     q->task, q->sender);
        q->reply(common::format_sigterm_answer(false));
      });
    });
    sigterm_questions_.push_back(std::move(question));
  });
}

void Supervisor::answer_sigterm_queries(bool job_stop) {
  std::vector<std::shared_ptr<SigtermQuestion>> held = std::move(sigterm_questions_);
  sigterm_questions_.clear();
  for (auto& q : held) {
    q->timer->cancel();
    spdlog::info("{}: SIGTERM from pid {}: {}", q->task, q->sender,
                 job_stop ? "the job is stopping; it saves with the group" : "the job has ended");
    q->reply(common::format_sigterm_answer(job_stop));
  }
}

// Only the process the launcher started for a task speaks for it (docs/control.md): any other
// process of this user could otherwise blame a healthy worker (issue 43).
std::string Supervisor::sender_refusal(const std::string& kind, const std::string& task,
                                       int peer_pid) const {
  const Task* named = nullptr;
  for (const auto& t : tasks_)
    if (t->plan.task.text() == task) named = t.get();
  if (!named) return "";
  if (!named->child || !named->alive())
    return kind == "message" ? "" : task + " has no running process";
  return named->child->sender_refusal(peer_pid, task);
}

void Supervisor::on_relayed_request(const std::string& request_json, ReformReplyFn reply) {
  std::string kind;
  try {
    common::JsonDocument doc = common::JsonDocument::parse(request_json, "relayed request");
    if (auto k = doc.root().find("request"); k && k->is_string()) kind = k->as_string();
  } catch (const common::ConfigError&) {
  }
  if (kind == "reform") return on_reform_request(request_json, std::move(reply));
  if (kind == "spare") return on_spare_request(request_json, std::move(reply));
  if (kind == "sigterm") return on_sigterm_query(request_json, std::move(reply));
  common::JsonWriter w;
  w.begin_object().key("ok").value(false);
  w.key("error").value("unknown request " + common::json_quote(kind)).end_object();
  reply(w.str() + "\n");
}

// Waits for a task's end to explain the broken group; a worker's newer request replaces its
// older one, so what is held stays bounded by the number of tasks.
void Supervisor::hold_reform(common::ReformRequest request, ReformReplyFn reply) {
  spdlog::info("{} lost its group ({}); waiting up to {:g} s for a task's end to explain it",
               request.task, request.what, options_.reform_hold_seconds);
  for (HeldReform& held : held_reforms_) {
    if (held.request.task != request.task) continue;
    held.reply(refusal("replaced by a newer request of the same task"));
    held = HeldReform{std::move(request), std::move(reply)};
    return;
  }
  held_reforms_.push_back(HeldReform{std::move(request), std::move(reply)});
  if (held_reforms_.size() > 1) return;
  reform_timer_->expires_after(options_.reform_hold_seconds);
  reform_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("reform timer", [this] { reform_hold_expired(); });
  });
}

// ok: every held request was of a generation below generation_ (they are all of the current
// one when held), so each may re-form as generation_.
void Supervisor::answer_held_reforms(bool ok, const std::string& error) {
  if (held_reforms_.empty()) return;
  reform_timer_->cancel();
  std::vector<HeldReform> held = std::move(held_reforms_);
  held_reforms_.clear();
  for (HeldReform& h : held) h.reply(ok ? join_reply(h.request.task) : refusal(error));
}

// No task ended to explain the broken group (a frozen worker, a cut link): the old path, a
// teardown blamed on the first worker that asked. begin_teardown refuses every held request.
void Supervisor::reform_hold_expired() {
  if (held_reforms_.empty() || phase_ != Phase::kRunning) return;
  if (!held_ends_.empty()) {  // an end explains it, and waits for Slurm's answer (5 s at most)
    reform_timer_->expires_after(options_.reform_hold_seconds);
    reform_timer_->async_wait([this](const boost::system::error_code& ec) {
      if (!ec) guarded("reform timer", [this] { reform_hold_expired(); });
    });
    return;
  }
  const common::ReformRequest& first = held_reforms_.front().request;
  std::string reason =
      fmt::format("{} lost its group ({}) but no task failed", first.task, first.what);
  spdlog::warn("{} within {:g} s", reason, options_.reform_hold_seconds);
  fail_first(*training_task(first.task), Outcome::kFailed, reason, common::kExitFailure);
  begin_teardown(reason);
}

// The new generation said where it resumed (restored_step), then stepped past it: the recovery
// is done, and recorded as the `recovered` event of docs/design.md#events.
void Supervisor::note_in_place_progress(const common::ControlMessage& message) {
  if (!in_place_recovery_ || message.generation.value_or(0) != in_place_recovery_->generation)
    return;
  PendingInPlace& pending = *in_place_recovery_;
  if (message.restored_step && !pending.restored_step)
    pending.restored_step = message.restored_step;
  std::optional<int64_t> step =
      message.type == common::ControlMessageType::kProgress ? reported_step(message) : std::nullopt;
  if (!pending.restored_step || !step || *step <= *pending.restored_step) return;
  // What the survivors held counts; when nobody held the state restored (every worker was
  // replaced, and the newest checkpoint restored), the furthest step reported does.
  int64_t reached =
      pending.reached_step >= *pending.restored_step ? pending.reached_step : reached_step_;
  Recovery r{attempt_,
             reached,
             *pending.restored_step,
             true,
             pending.generation,
             now() - pending.failed_at};
  in_place_recovery_.reset();
  reform_furthest_ = -1;
  result_.recoveries.push_back(r);
  spdlog::info("generation {} of attempt {} resumed at step {} in {:.1f} s: {} step(s) redone",
               r.generation, r.attempt, r.restored_step, r.seconds, r.steps_redone());
  recorder_.event("recovered", [&](common::JsonWriter& w) {
    w.key("attempt").value(r.attempt).key("path").value("in_place");
    w.key("generation").value(r.generation).key("restored_step").value(r.restored_step);
    w.key("steps_redone").value(r.steps_redone()).key("seconds").value(r.seconds);
  });
}

}  // namespace dtrain::launcher
