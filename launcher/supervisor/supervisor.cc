// See supervisor.h. This file starts an attempt and takes in what its tasks do: output, signs of
// life, their ends. Teardown, back-off and the end of the job are in supervisor_teardown.cc;
// replacements in place and reform requests in supervisor_in_place.cc; the snapshot in
// supervisor_state.cc; the launcher's own faults in supervisor_faults.cc.
#include "launcher/supervisor/supervisor.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/run_dir.h"
#include "launcher/plan/worker_env.h"
#include "launcher/supervisor/recovery_policy.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {
constexpr double kStateWriteInterval = 1.0;
constexpr double kExitStateWriteInterval = 0.1;
}  // namespace

Supervisor::Supervisor(boost::asio::io_context& io, ProcessSpawner& spawner, RunRecorder& recorder,
                       Console& console, GroupGuardian* guardian, SupervisorOptions options)
    : io_(io),
      spawner_(spawner),
      recorder_(recorder),
      console_(console),
      guardian_(guardian),
      options_(std::move(options)),
      plan_(options_.plan),
      book_(plan_.spec().restart, options_.jitter_seed),
      own_clock_(options_.clock ? nullptr : make_steady_clock(io)),
      clock_(options_.clock ? options_.clock : own_clock_.get()),
      backoff_timer_(clock_->make_timer()),
      grace_timer_(clock_->make_timer()),
      watchdog_timer_(clock_->make_timer()),
      port_timer_(clock_->make_timer()),
      reform_timer_(clock_->make_timer()),
      freeze_timer_(clock_->make_timer()),
      freeze_(FreezeSettings{plan_.spec().freeze_seconds}),
      attempt_(options_.first_attempt),
      master_port_(plan_.master_port) {
  for (const TaskPlan& p : plan_.tasks) ports_.push_back(p.endpoint.port);
  std::vector<const TaskPlan*> plans;  // the cluster's tasks, then the spares
  for (const TaskPlan& p : plan_.tasks) plans.push_back(&p);
  for (const TaskPlan& p : plan_.spares) plans.push_back(&p);
  for (const TaskPlan* plan : plans) {
    const TaskPlan& p = *plan;
    auto task = std::make_unique<Task>(p);
    Task* raw = task.get();
    task->splitter = std::make_unique<LineSplitter>([this, raw](std::string_view line) {
      raw->pending.append(line);
      raw->remember(line);
      console_.print_line(raw->plan.task, line);
    });
    tasks_.push_back(std::move(task));
  }
}

Supervisor::~Supervisor() = default;

void Supervisor::start(std::function<void(const SupervisorResult&)> on_done) {
  on_done_ = std::move(on_done);
  launcher_started_ = now();
  guarded("start", [this] { start_attempt(); });
}

void Supervisor::start_attempt() {
  phase_ = Phase::kStarting;
  rate_origin_step_ = -1;
  first_failure_.reset();
  generation_ = 0;
  in_place_recovery_.reset();
  step_at_last_in_place_ = reached_step_;
  for (auto& task : tasks_) {
    task->silent_ends = 0;
    // A lost host's replacement backing off when the group fell starts with the attempt.
    if (task->state == Task::State::kReplacing) task->state = Task::State::kEnded;
    if (task->respawn_timer) task->respawn_timer->cancel();
    // An elastic job's tasks whose host is gone stay out; their host is tried again
    // (docs/design.md#elastic-membership). Their joiners went with the teardown.
    if (task->away()) task->state = Task::State::kAway;
    task->held_reply = nullptr;
    task->noticed = 0;
    task->reformed_to = 0;
  }
  success_ = false;
  attempt_made_progress_ = false;
  if (elastic() && !plan_.in_place) {  // a command job starts with the members' cluster
    std::set<common::TaskId> away;
    for (auto& task : tasks_)
      if (task->away()) away.insert(task->plan.task);
    members_plan_.reset();
    members_index_.clear();
    if (!away.empty()) {
      members_plan_ = std::make_unique<LaunchPlan>(members_plan(plan_, away));
      size_t i = 0;
      for (auto& task : tasks_)
        if (!task->away() && !task->plan.spare()) members_index_[task->plan.task.text()] = i++;
    }
  }
  if (!ports_free_or_retry()) return;
  port_retries_ = 0;
  attempt_started_ = now();
  for (auto& task : tasks_) {
    if (task->away()) continue;
    try {
      spawn_task(*task);
    } catch (const common::ConfigError& e) {
      fail_first(*task, Outcome::kConfigError, e.what(), common::kExitConfig);
      return begin_teardown("a worker could not be started");
    } catch (const common::IoError& e) {
      if (fail_first(*task, Outcome::kFailed, e.what(), common::kExitFailure))
        first_failure_->never_started = true;
      return begin_teardown("a worker could not be started");
    }
  }
  phase_ = Phase::kRunning;
  spdlog::info(
      "attempt {}: {} task(s) running", attempt_,
      std::count_if(tasks_.begin(), tasks_.end(), [](const auto& t) { return !t->away(); }));
  resume_rejoins();
  write_state();
  arm_watchdog();
  freeze_.reset(/*fresh=*/true);  // every member is a process of this attempt
  arm_freeze_watch();
}

// A log that cannot be written is the launcher's fault (a full disk): guarded() reports the
// first such error once the handler is done.
void Supervisor::append_to_log(Task& task, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(task.log.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (!log_error_)
        log_error_ = fmt::format("cannot write {}: {}", task.plan.log_path,
                                 n < 0 ? std::strerror(errno) : "nothing written");
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void Supervisor::spawn_task(Task& task) {
  const std::string& log_path = task.plan.log_path;
  task.log.reset(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!task.log.valid())
    throw common::IoError(fmt::format("cannot open {}: {}", log_path, std::strerror(errno)));
  // An elastic command job without some of its tasks: the members' cluster, renumbered.
  const bool view = members_plan_ && !task.plan.spare();
  // An away task started again joins the group (docs/design.md#elastic-membership).
  const bool joiner = task.state == Task::State::kAway;
  SpawnRequest request = make_spawn_request(
      view ? *members_plan_ : plan_,
      view ? members_plan_->tasks.at(members_index_.at(task.plan.task.text())) : task.plan,
      {attempt_, master_port_, view ? std::string_view() : std::string_view(cluster_json_),
       generation_, elastic() ? members_text() : "", joiner, attempt_ - options_.first_attempt});
  task.progress_path_now = task.plan.progress_path;
  ChildCallbacks callbacks;
  // The record the child's events go to: a promoted spare's child moves to the task it replaces
  // (supervisor_spares.cc), its callbacks with it.
  auto route = std::make_shared<Task*>(&task);
  task.route = route;
  callbacks.on_output = [this, route](std::string_view bytes) {
    guarded("output", [&] { on_output(**route, bytes); });
  };
  callbacks.on_output_closed = [this, route] {
    guarded("end of output", [&] { on_output_closed(**route); });
  };
  callbacks.on_exit = [this, route](const ChildEnd& end) {
    guarded("exit", [&] { on_exit(**route, end); });
  };
  callbacks.on_started = [this, route](int remote_pid) {
    guarded("start report", [&] { on_started(**route, remote_pid); });
  };
  callbacks.on_control = [this](const std::string& line) {
    if (auto message = common::parse_control_message(line)) on_control_message(*message);
  };
  callbacks.on_signaled = [this, route](int sig, bool place_ending) {
    guarded("remote signal", [&] { on_signaled(**route, sig, place_ending); });
  };
  // A remote worker's reform or spare request, relayed by its agent.
  callbacks.on_request = [this](const std::string& json, ReformReplyFn reply) {
    on_relayed_request(json, std::move(reply));
  };
  std::unique_ptr<Child> child = spawner_.spawn(request, std::move(callbacks));
  const Task::State state = joiner                   ? Task::State::kJoining
                            : child->reports_start() ? Task::State::kStarting
                                                     : Task::State::kRunning;
  task.begin_run(std::move(child), state, now(), generation_);
  task.output_open = true;
  if (guardian_) guardian_->watch(task.pid);
  append_to_log(task, common::attempt_header(attempt_, task.plan.task, task.pid,
                                             common::utc_timestamp(), generation_) +
                          "\n");
  recorder_.event("spawn", [&](common::JsonWriter& w) {
    w.key("task").value(task.plan.task.text()).key("pid").value(task.pid);
    w.key("attempt").value(attempt_);
    if (generation_ > 0) w.key("generation").value(generation_);
  });
}

void Supervisor::on_output(Task& task, std::string_view bytes) {
  task.splitter->feed(bytes);
  if (!task.pending.empty()) {
    append_to_log(task, task.pending);
    task.pending.clear();
    // A command job's output is its sign of life; a remote shell's words before the agent
    // started the worker are not.
    if (!plan_.spec().command.empty() && task.state == Task::State::kRunning)
      note_progress(task, nullptr);
  }
  console_.flush();
}

void Supervisor::on_output_closed(Task& task) {
  task.splitter->finish();
  if (!task.pending.empty()) {
    // A last line without a newline is kept whole; the newline keeps the next header apart.
    task.pending += '\n';
    append_to_log(task, task.pending);
    task.pending.clear();
  }
  console_.flush();
  task.output_open = false;
  if (task.state == Task::State::kReplacing) respawn(task);
  maybe_teardown_complete();
}

void Supervisor::on_started(Task& task, int remote_pid) {
  if (task.state == Task::State::kStarting) task.state = Task::State::kRunning;
  task.remote_pid = remote_pid;
  if (returning_.erase(task.plan.where)) {  // an elastic host back for good
    false_returns_.erase(task.plan.where);
    rejoin_delays_.erase(task.plan.where);
  }
  recorder_.event("remote_start", [&](common::JsonWriter& w) {
    w.key("task").value(task.plan.task.text()).key("remote_pid").value(remote_pid);
  });
}

// Someone other than the launcher signalled a remote task: a host shutting down (the worker
// saves and exits 143, a preemption the group recovers from), or its place going away (Slurm
// ending the job's steps), in which case the launch stops and exits 143 to be requeued.
void Supervisor::on_signaled(Task& task, int sig, bool place_ending) {
  recorder_.event("remote_signal", [&](common::JsonWriter& w) {
    w.key("task")
        .value(task.plan.task.text())
        .key("signal")
        .value(signal_name(sig))
        .key("attempt")
        .value(attempt_);
  });
  if (!place_ending || stop_requested_) return;
  spdlog::warn(
      "{}: {} got {} (preemption, time limit or scancel): the workers save a checkpoint and the "
      "launch ends with {} so the job can be requeued",
      task.plan.task.text(), task.plan.place_text(), signal_name(sig), common::kExitPreempted);
  stop(sig);
}

// What an end means for the group: its outcome and text, and the facts the restart decision
// needs. A remote task's place that was lost stays lost for this launch: starts that fail
// there are the lost host again, not a configuration problem.
Supervisor::EndReading Supervisor::read_end(const Task& task, const ChildEnd& end) {
  EndReading r;
  bool exited = end.cause == ChildEnd::Cause::kExited;
  r.started = end.cause != ChildEnd::Cause::kNotStarted;
  r.outcome = exited ? classify(end.status) : Outcome::kFailed;
  r.exit_code = exited ? job_exit_code(end.status) : common::kExitFailure;
  r.what = exited ? describe(end.status) : end.detail;
  if (task.frozen) {  // the freeze watch's SIGKILL: a failure, not a preemption
    r.outcome = Outcome::kFailed;
    r.exit_code = common::kExitFailure;
    r.what = "frozen: " + task.frozen->why;
  }
  if (end.cause == ChildEnd::Cause::kPlaceLost) lost_places_.insert(task.plan.where);
  r.place_lost = !exited && lost_places_.count(task.plan.where) > 0;
  if (r.place_lost && !r.started)
    r.what = fmt::format("{} was lost earlier and is still unreachable: {}", task.plan.place_text(),
                         r.what);
  if (!end.explanation.empty()) r.what = end.explanation;
  return r;
}

void Supervisor::on_exit(Task& task, const ChildEnd& end) {
  // An away task's end is on_away_end's to read (whether it was a joiner).
  if (!task.away()) task.state = Task::State::kEnded;
  task.status = end.status;
  EndReading r = read_end(task, end);
  if (end.cause != ChildEnd::Cause::kExited) {
    recorder_.event(r.started ? "lost_host" : "start_failure", [&](common::JsonWriter& w) {
      w.key("task").value(task.plan.task.text()).key("host").value(task.plan.where);
      w.key("what").value(r.what);
    });
  }
  recorder_.event("exit", [&](common::JsonWriter& w) {
    w.key("task").value(task.plan.task.text()).key("pid").value(task.pid);
    w.key("attempt").value(attempt_).key("outcome").value(outcome_name(r.outcome));
    w.key("status").value(describe(end.status));
    if (end.status.signaled)
      w.key("signal").value(signal_name(end.status.signal));
    else
      w.key("exit_code").value(end.status.code);
  });
  if (r.outcome != Outcome::kSuccess && !task.away() && !task.plan.spare() &&
      (phase_ == Phase::kRunning || phase_ == Phase::kStarting))
    spdlog::warn("{} {} ({}) on attempt {}", task.plan.task.text(), outcome_name(r.outcome), r.what,
                 attempt_);
  decide_end(task, r, end);
  // At most ten writes a second for exits alone: a thousand tasks ending together must not cost a
  // thousand fsynced rewrites. Phase changes write at once (begin_teardown, finish).
  if (now() - last_state_write_ >= kExitStateWriteInterval) write_state();
  maybe_teardown_complete();
}

// The facts of docs/design.md#the-recovery-policy, read from the records; budget is asked the
// in-place question (a copy of the book: the decision says whether it counts).
EndFacts Supervisor::end_facts(const Task& task, const EndReading& r, const ChildEnd& end,
                               RestartBook& budget, Decision& in_place) const {
  EndFacts f;
  f.in_place = plan_.in_place;
  f.elastic = elastic();
  f.slurm = plan_.context.slurm.has_value();
  f.phase = phase_ == Phase::kRunning    ? GroupPhase::kRunning
            : phase_ == Phase::kStarting ? GroupPhase::kStarting
                                         : GroupPhase::kEnding;
  f.stopping = stop_requested_;
  f.group_finished = r.outcome == Outcome::kSuccess && group_succeeded();
  f.re_forming = in_place_recovery_.has_value();
  f.member_finished = finished_member() != nullptr;
  f.others_train = others_train(task);
  f.role = task.plan.spare()    ? TaskRole::kSpare
           : task.plan.trains() ? TaskRole::kTraining
                                : TaskRole::kOther;
  f.away = task.away();
  f.host_can_leave = task.plan.place_can_leave();
  if (f.elastic && f.host_can_leave && f.role == TaskRole::kTraining)
    f.host_must_stay = host_must_stay(task.plan.where);
  f.outcome = r.outcome;
  f.started = r.started;
  f.place_lost = r.place_lost;
  f.saved_and_stopped = !end.status.signaled && end.status.code == common::kExitPreempted;
  // The freeze watch may blame a cut-off member for its stale record before its agent's silence
  // reaches kSilentSeconds; a silence that long at its end says the same.
  f.host_silent =
      task.frozen && (task.frozen->cause == FreezeCause::kSilent ||
                      (task.child && task.child->look(task.progress_path_now).silent_seconds >=
                                         FreezeWatch::kSilentSeconds));
  f.node_leaving = r.node_leaving;
  // The rule against crash loops, in place, is the task's own: the same task ending twice in a
  // row with no progress in between, neither its own report nor a step of the group past the
  // furthest one of the last failure. Other tasks ending meanwhile (several faults while the
  // group is stalled) are no loop.
  const bool group_moved = reached_step_ > step_at_last_in_place_;
  f.silent_ends = task.made_progress || group_moved ? 0 : task.silent_ends + 1;
  if (in_place_applies(f)) {
    // A lost host's replacement is no start failure of a bad configuration (as the whole-group
    // path reads it): it backs off exponentially within the budget, so an outage is ridden out.
    // So does any replacement on a host lost in this launch (a member there found frozen, its
    // host cut off): it starts where the last one could not be reached.
    const bool host_lost = r.place_lost || lost_places_.count(task.plan.where) > 0;
    const bool sigkill = r.started && killed_by_sigkill(end.status);
    in_place = budget.decide_in_place(
        {r.outcome, true, now() - task.spawned_at, sigkill, !r.started && !r.place_lost},
        host_lost);
    f.budget_allows = in_place.restart;
    f.budget_refusal = in_place.reason;
  }
  return f;
}

// The policy's action, carried out (docs/design.md#the-recovery-policy). Also run again for an
// end held for Slurm's answer, with the answer in r.
void Supervisor::decide_end(Task& task, const EndReading& r, const ChildEnd& end) {
  RestartBook budget = book_;
  Decision in_place;
  const EndFacts f = end_facts(task, r, end, budget, in_place);
  const EndDecision d = launcher::decide_end(f);
  spdlog::debug("{}: {} ({})", task.plan.task.text(), end_action_name(d.action),
                outcome_name(r.outcome));
  if (d.counts_silent_end) {
    task.silent_ends = f.silent_ends;
    step_at_last_in_place_ = reached_step_;
  }
  if (d.counted_in_place) book_ = budget;
  if (d.host_kept) spdlog::warn("no shrink: {}", f.host_must_stay);
  // Slurm's word, when it is why the host leaves.
  const std::string why =
      r.node_leaving && !r.node_leaving->empty()
          ? fmt::format("{}; Slurm has node {} {}", r.what, task.plan.where, *r.node_leaving)
          : r.what;
  if (r.outcome == Outcome::kSuccess && f.phase != GroupPhase::kEnding && !f.away &&
      f.role != TaskRole::kSpare)
    spdlog::info("{} finished", task.plan.task.text());
  switch (d.action) {
    case EndAction::kNone:
      return;
    case EndAction::kAwayEnded:
      return on_away_end(task, r);
    case EndAction::kRestartSpare:
      return on_spare_end(task, r);
    case EndAction::kSucceed:
      success_ = true;
      return begin_teardown("every training task finished");
    case EndAction::kAbandonReform:
      return abandon_in_place(task);
    case EndAction::kAskSlurm:
      return hold_for_slurm(task, r, end);
    case EndAction::kShrink:
      shrink_host(task.plan.where, why, &task);
      return;
    case EndAction::kReplace:
      return replace_in_place(task, r, in_place.delay_seconds);
    case EndAction::kLeaveAndRestart:
      return leave_and_restart(task, r, why);
    case EndAction::kRestartGroup:
      break;
  }
  switch (d.refusal) {
    case InPlaceRefusal::kNone:
      break;
    case InPlaceRefusal::kMemberFinished:
      spdlog::warn("no recovery in place: {} has finished, so the group cannot re-form",
                   finished_member()->plan.task.text());
      break;
    case InPlaceRefusal::kCrashLoop:
      spdlog::warn(
          "no recovery in place: {} ended twice in a row before the group made progress{}; not "
          "replacing it",
          task.plan.task.text(),
          r.started && killed_by_sigkill(end.status)
              ? ", killed by SIGKILL (the kernel's OOM killer does this to a worker that needs "
                "more memory than it may use)"
              : " (a crash loop, not a transient failure)");
      break;
    case InPlaceRefusal::kBudget:
      spdlog::warn("no recovery in place: {}", f.budget_refusal);
      break;
  }
  if (fail_first(task, r.outcome, r.what, r.exit_code)) {
    first_failure_->never_started = !r.started;
    first_failure_->sigkill = r.started && killed_by_sigkill(end.status);
    first_failure_->place_lost = r.place_lost;
  }
  begin_teardown(fmt::format("{} {}", task.plan.task.text(), outcome_name(r.outcome)));
}

// A sign of life: any control message, or for a command job any output line. A progress
// message also says how far the group got, and the first one after a restart where it resumed.
void Supervisor::note_progress(Task& task, const common::ControlMessage* message) {
  task.last_progress = now();
  // Where a restart resumed is said before its first step: a sign of life, not progress.
  if (!message || !message->restored_step) attempt_made_progress_ = task.made_progress = true;
  if (!message || !task.plan.trains()) return;
  note_in_place_progress(*message);
  if (message->restored_step && recovering_ && message->generation.value_or(0) == 0) {
    recovering_ = false;
    Recovery r{attempt_, reached_step_, *message->restored_step, false, 0, 0};
    result_.recoveries.push_back(r);
    spdlog::info("attempt {} resumed at step {}: {} step(s) redone", attempt_, r.restored_step,
                 r.steps_redone());
    recorder_.event("recovered", [&](common::JsonWriter& w) {
      w.key("attempt")
          .value(attempt_)
          .key("path")
          .value("restart")
          .key("restored_step")
          .value(r.restored_step)
          .key("steps_redone")
          .value(r.steps_redone());
    });
  }
  if (message->type != common::ControlMessageType::kProgress) return;
  task.progress = *message;
  if (auto step = reported_step(*message)) reached_step_ = std::max(reached_step_, *step);
}

void Supervisor::on_control_message(const common::ControlMessage& message) {
  if (message.attempt != attempt_) return;  // a late word from an earlier attempt
  guarded("control message", [&] {
    for (auto& task : tasks_) {
      if (task->plan.task.text() != message.task || !task->alive()) continue;
      note_progress(*task, &message);
    }
    if (now() - last_state_write_ >= kStateWriteInterval) write_state();
    update_live_view();
  });
}

bool Supervisor::group_succeeded() const {
  bool chief_only = plan_.spec().success == common::SuccessRule::kChiefOnly;
  const Task* chief = acting_chief();
  for (const auto& task : tasks_) {
    if (!member(*task) || (chief_only && task.get() != chief)) continue;
    if (!task->status || classify(*task->status) != Outcome::kSuccess) return false;
  }
  return true;
}

bool Supervisor::fail_first(const Task& task, Outcome outcome, const std::string& what, int code) {
  settle_held_ends();  // an end that waits for Slurm's answer came first
  if (first_failure_) return false;
  first_failure_ = failure_of(task, outcome, what, code);
  return true;
}

}  // namespace dtrain::launcher
