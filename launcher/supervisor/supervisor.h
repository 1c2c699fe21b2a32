// The supervisor: the group's state machine (docs/design.md#supervisor). It starts every task
// of the launch plan, watches them, and on the first failure stops the whole group (SIGTERM to
// all at once, one shared grace period, then SIGKILL) and starts it again after a back-off, as
// restart_policy decides; in place (docs/design.md#in-place-recovery), a failed training task is
// replaced while the others run on. It knows tasks and their ends, not deployment modes: where a
// task runs is the plan's business, how a remote one is reached the child's (remote_child.h). One
// io_context thread, no locks; processes come from a ProcessSpawner, so every path runs against
// a fake in unit tests.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/control_protocol.h"
#include "launcher/placement/process_spawner.h"
#include "launcher/plan/launch_plan.h"
#include "launcher/process/freeze_watch.h"
#include "launcher/process/group_guardian.h"
#include "launcher/process/loop_clock.h"
#include "launcher/supervisor/recovery_policy.h"
#include "launcher/supervisor/restart_policy.h"
#include "launcher/supervisor/run_records.h"
#include "launcher/view/console.h"
#include "launcher/view/group_view.h"

namespace dtrain::launcher {

/// The first failure of an attempt: what the summary shows.
struct FailureReport {
  common::TaskId task;
  int attempt = 0;
  Outcome outcome = Outcome::kFailed;
  std::string what;   ///< "exit code 3", "killed by SIGSEGV", "hung: no progress for 5 s"
  int exit_code = 1;  ///< the launcher's exit code if this ends the job
  std::string log_path;
  /// The task's last output lines of that attempt, kept in memory: on a full disk its log may
  /// not have them.
  std::vector<std::string> last_lines;
  bool never_started = false;  ///< the task was never started (spawn error, remote start failure)
  bool sigkill = false;        ///< it died by SIGKILL (the OOM killer at every start?)
  /// Its host or node was lost in this launch (now, or on an earlier attempt and still
  /// unreachable): the group backs off within the restart budget and is not "misconfigured".
  bool place_lost = false;
};

/// One recovery: the group started again, or re-formed in place, and resumed at restored_step.
struct Recovery {
  int attempt = 0;            ///< the attempt that resumed
  int64_t reached_step = 0;   ///< the furthest step reported before the failure
  int64_t restored_step = 0;  ///< the step the group resumed from
  bool in_place = false;      ///< re-formed in place (docs/design.md#in-place-recovery)
  int generation = 0;         ///< in place: the generation that resumed
  double seconds = 0;         ///< in place: from the failed end to the new generation's first step
  int64_t steps_redone() const {
    return reached_step > restored_step ? reached_step - restored_step : 0;
  }
};

struct SupervisorResult {
  std::string status;  ///< common::kStatusSucceeded, kStatusFailed or kStatusStopped
  int exit_code = 0;
  std::string reason;  ///< for a fault of the launcher itself, "launcher: <what failed>"
  std::optional<FailureReport> failure;
  /// The restarts whose resumed step is known, and the re-formations in place that stepped on.
  std::vector<Recovery> recoveries;
};

/// Answers a reform request: one line on the connection it came on (ControlServer::Reply).
using ReformReplyFn = std::function<void(const std::string& line)>;

struct SupervisorOptions {
  LaunchPlan plan;
  int first_attempt = 0;
  uint64_t jitter_seed = 0;
  double kill_drain_seconds = 5;  ///< after SIGKILL, how long to wait for output to close
  /// How long a reform request waits for a task's end to explain it before the group is torn
  /// down (docs/design.md#in-place-recovery).
  double reform_hold_seconds = 10;
  /// Elastic (docs/design.md#elastic-membership): a host left is tried again after
  /// rejoin_first_seconds, each failed try doubling the wait up to rejoin_most_seconds.
  double rejoin_first_seconds = 1;
  /// Low, so that a host is back within seconds of answering: a try of a host still cut off
  /// costs one connection attempt.
  double rejoin_most_seconds = 5;
  /// How long a worker's question about a SIGTERM from elsewhere waits for a stop of the
  /// launcher's own before it is answered "this worker alone" (on_sigterm_query).
  double sigterm_confirm_seconds = 1;
  /// How long Slurm may take to say how a node is (`scontrol show node`, a side run); past it the
  /// node is taken as usable (docs/design.md#elastic-membership).
  double slurm_question_seconds = 5;
  /// The loop's time (docs/design.md#time-on-the-loop): not owned; null, the steady clock.
  LoopClock* clock = nullptr;
};

/// A worker still saving when the stop's grace period ends gets more time, up to this many
/// times the grace and at least kSaveGraceFloorSeconds from the SIGTERM
/// (Supervisor::grace_expired).
inline constexpr double kSaveGraceFactor = 6;
inline constexpr double kSaveGraceFloorSeconds = 60;

class Supervisor {
 public:
  /// None of the references are owned; all must outlive the supervisor. guardian may be null.
  Supervisor(boost::asio::io_context& io, ProcessSpawner& spawner, RunRecorder& recorder,
             Console& console, GroupGuardian* guardian, SupervisorOptions options);
  ~Supervisor();

  /// Starts attempt first_attempt. on_done runs once, when the job has ended.
  void start(std::function<void(const SupervisorResult&)> on_done);
  /// Graceful stop (a signal to the launcher): SIGTERM the group, grace, then the job ends
  /// "stopped" with exit 143.
  void stop(int signal);
  /// SIGKILL every worker group now (second Ctrl-C).
  void kill_now();
  /// A heartbeat or progress line from a worker (DTRAIN_CONTROL, or relayed by its agent).
  void on_control_message(const common::ControlMessage& message);
  /// A worker's {"request": "reform", ...} line (docs/design.md#in-place-recovery). Answered at
  /// once when its generation has been re-formed already or cannot be; else held until a
  /// training task's end makes the next generation, or the group is torn down, or
  /// reform_hold_seconds pass (the group is then torn down). One request per task is held; a
  /// newer one replaces it.
  void on_reform_request(const std::string& request_json, ReformReplyFn reply);
  /// A spare's request to be promoted (docs/design.md#in-place-recovery); held until a task
  /// fails (then answered with that task's place) or the job ends (answered ok:false).
  void on_spare_request(const std::string& request_json, ReformReplyFn reply);
  /// A worker's {"request": "sigterm", ...}: it got a SIGTERM from a process other than its
  /// parent (docs/design.md#in-place-recovery). Answered job_stop true at once when the launcher
  /// is stopping, or as soon as it is told to within sigterm_confirm_seconds (a stop of the whole
  /// job signals the launcher and the workers together); else job_stop false then (a preemption
  /// of that worker alone).
  void on_sigterm_query(const std::string& request_json, ReformReplyFn reply);
  /// A request a remote worker's agent relayed (remote_child.h): a reform or spare request, as
  /// if it had come on the control socket; anything else is refused.
  void on_relayed_request(const std::string& request_json, ReformReplyFn reply);
  /// Whether the process peer_pid may send a kind line ("message" for a heartbeat or progress, or
  /// a request's kind) naming task on the control socket (ControlServer::SenderCheck): "" when it
  /// is that task's running local process or in its process group, or when task is none of this
  /// launch's (the handlers answer for those); else why not. A message for a task that is not
  /// running is let through (it is ignored); a request is refused. docs/control.md.
  std::string sender_refusal(const std::string& kind, const std::string& task, int peer_pid) const;
  /// A fault of the launcher's own (a write that failed, an exception in a handler): logs it,
  /// stops the group as a failure with no restart, and ends the job "failed" with reason
  /// "launcher: <what>". Every handler's exceptions end here; it throws nothing.
  void on_fault(const std::string& what) noexcept;

  int attempt() const { return attempt_; }
  int generation() const { return generation_; }  ///< of the current attempt, 0 first
  /// The group as `dtrain status`, state.json and Prometheus see it now.
  GroupSnapshot snapshot() const;
  const RestartBook& book() const { return book_; }

 private:
  struct Task;
  enum class Phase { kStarting, kRunning, kTearingDown, kBackingOff, kDone };

  /// Runs the body of an Asio handler (child callback, timer, request) so that nothing escapes
  /// into the loop: an exception, or a write that failed meanwhile, goes to on_fault.
  void guarded(const char* handler, const std::function<void()>& body) noexcept;
  /// Last resort when stopping cleanly threw too: SIGKILL every group and end the job.
  void emergency_stop(const std::string& what) noexcept;
  /// A task whose last lines say the disk is full takes the blame from one that failed first
  /// without saying why (it lost its peer, or its write failed silently).
  void blame_disk_full();
  FailureReport failure_of(const Task& task, Outcome outcome, const std::string& what,
                           int exit_code) const;

  // The attempt's life: start -> (output, exits, signs of life) -> first failure or success ->
  // teardown -> back-off -> start, or finish.
  void start_attempt();
  bool ports_free_or_retry();
  void repick_port(size_t task);
  void spawn_task(Task& task);
  void append_to_log(Task& task, const std::string& text);
  void on_output(Task& task, std::string_view bytes);
  void on_output_closed(Task& task);
  void on_started(Task& task, int remote_pid);
  struct EndReading {
    Outcome outcome = Outcome::kFailed;
    int exit_code = 1;
    std::string what;
    bool started = true;
    bool place_lost = false;
    /// Under Slurm, once asked (ask_slurm): why Slurm is taking the task's node away, "" when it
    /// is not (or could not say); unset before the question.
    std::optional<std::string> node_leaving;
  };
  EndReading read_end(const Task& task, const ChildEnd& end);
  void on_exit(Task& task, const ChildEnd& end);
  /// The recovery policy's facts about task's end (recovery_policy.h). budget is asked the
  /// in-place question, its answer left in in_place.
  EndFacts end_facts(const Task& task, const EndReading& reading, const ChildEnd& end,
                     RestartBook& budget, Decision& in_place) const;
  /// What the end means for the group (on_exit's decision, after its records): the recovery
  /// policy's action (docs/design.md#the-recovery-policy), carried out. Also run again for an
  /// end held for Slurm's answer, with the answer in reading.
  void decide_end(Task& task, const EndReading& reading, const ChildEnd& end);
  void on_signaled(Task& task, int sig, bool place_ending);
  void note_progress(Task& task, const common::ControlMessage* message);

  // Recovery in place (supervisor_in_place.cc): a training task's failed end while others run
  // makes the next generation and a replacement; reform requests wait for such an end.
  struct HeldReform {
    common::ReformRequest request;
    ReformReplyFn reply;
  };
  /// The re-formation that has not yet stepped on: for its `recovered` event.
  struct PendingInPlace {
    int generation = 0;
    double failed_at = 0;  ///< monotonic time of the first failed end it recovers from
    int64_t reached_step = 0;
    std::optional<int64_t> restored_step;
    /// The failed end it recovers from (the first, when several): the failure the whole-group
    /// path reports if the re-formation is given up.
    std::optional<FailureReport> cause;
  };
  void replace_in_place(Task& task, const EndReading& reading, double delay_seconds);
  bool others_train(const Task& task) const;
  /// A member that has finished (exit 0): it takes part in no re-formation. Null when none.
  const Task* finished_member() const;
  /// A member finished while a re-formation was pending without taking part in it: the
  /// generation cannot form; the group restarts.
  void abandon_in_place(const Task& finished);
  /// The reply that tells task to join generation_ (noted as its reformed_to).
  std::string join_reply(const std::string& task);
  void drain_then_respawn(Task& task);
  /// The notice of generation_ (SIGUSR1 with its number) to every running member that runs
  /// dtrain-worker's loop, but those skip names.
  void notify_members(const std::function<bool(const Task&)>& skip);
  void respawn(Task& task);
  /// A replacement of the pending re-formation is on its way: its start backs off, or it runs,
  /// has reported nothing yet and was spawned less than restart.startup_seconds ago.
  bool replacement_starting() const;
  /// The members wait in a re-formation (a pending one, or reform requests held): the hang
  /// watchdog leaves them alone for at most startup_seconds + hang_timeout_seconds.
  bool re_forming(double now) const;
  void hold_reform(common::ReformRequest request, ReformReplyFn reply);
  void answer_held_reforms(bool ok, const std::string& error);
  /// A task still running kill_drain_seconds after SIGKILL: logs and records it ("unkillable",
  /// with why) and takes it as ended, so the teardown is bounded.
  void give_up_unkillable(Task& task);
  /// Answers every held SIGTERM question (on_sigterm_query) with job_stop.
  void answer_sigterm_queries(bool job_stop);
  void reform_hold_expired();
  void note_in_place_progress(const common::ControlMessage& message);
  Task* training_task(const std::string& name);
  bool group_succeeded() const;
  /// Keeps the attempt's first failure; true when this was it.
  bool fail_first(const Task& task, Outcome outcome, const std::string& what, int exit_code);
  void begin_teardown(const std::string& reason);
  /// The grace period after SIGTERM is over: a worker whose record says it is saving (a
  /// checkpoint on a slow disk) gets more time, up to kSaveGraceFactor x the grace and at least
  /// kSaveGraceFloorSeconds in all; then SIGKILL (docs/design.md#supervisor-states).
  void grace_expired();
  /// A training task whose progress record says it is writing a checkpoint or a model, or null.
  const Task* saving_task() const;
  /// What a stop left (for the job's end line): the checkpoint the chief saved, or that none was.
  std::string stop_outcome() const;
  void signal_all(int sig);
  void maybe_teardown_complete();
  void teardown_complete();
  void back_off(const Decision& decision);
  void finish(const std::string& status, int exit_code, const std::string& reason);
  void cancel_timers() noexcept;
  void arm_watchdog();
  void check_watchdog();
  // Elastic membership (supervisor_elastic.cc, docs/design.md#elastic-membership).
  bool elastic() const;
  /// A training task in the group now (not away).
  bool member(const Task& task) const;
  /// The members' ring ranks (common::format_members); "" when every training task is one.
  std::string members_text() const;
  int world_size() const;
  const Task* acting_chief() const;
  void record_membership(const char* kind, const std::string& host,
                         const std::vector<std::string>& names, const std::string& why);
  /// Why host's members may not leave the group, "" when they may (or none is there).
  std::string host_must_stay(const std::string& host) const;
  /// Every member of host leaves; false (nothing done) when that would leave fewer than
  /// min_workers or the chief is there. cause: the task whose end started it (may be null).
  bool shrink_host(const std::string& host, const std::string& why, const Task* cause);
  // elastic.host_discovery: run every interval; its list says which hosts may be used.
  void arm_discovery(double delay);
  void run_discovery();
  void on_discovery_end(const ChildEnd& end);
  void apply_discovery();
  // Slurm's word on a node (supervisor_slurm.cc): `scontrol show node` as a side run, never a
  // wait on the loop (docs/design.md#elastic-membership).
  /// Asks Slurm about node; then(state) runs on the loop once it answers, state being the node's
  /// State when Slurm is taking it away (drained, down, ...), else "" (also when scontrol fails
  /// or says nothing within slurm_question_seconds: the node is taken as usable). One question per
  /// node at a time: a second caller waits for the same answer. Never calls then before it
  /// returns.
  void ask_slurm(const std::string& node, std::function<void(const std::string&)> then);
  void on_node_answer(const std::string& node, const ChildEnd& end);
  /// Runs what waits for node's answer (leaving: its State, "" usable).
  void answer_node_question(const std::string& node, const std::string& leaving);
  /// Holds task's end until Slurm says whether its node is leaving; decide_end runs again with
  /// the answer in the reading's node_leaving.
  void hold_for_slurm(Task& task, const EndReading& reading, const ChildEnd& end);
  /// The group stops while ends wait for Slurm: each is taken as a failure on a usable node (the
  /// first of them is the attempt's first failure when none is yet), and none waits any more.
  void settle_held_ends();
  // Elastic command jobs: a membership change restarts the group (as torchrun's elastic agent).
  void leave_and_restart(Task& task, const EndReading& reading, const std::string& why);
  /// Marks host's members away (false when min_workers or the chief forbid it).
  bool may_let_go(const std::string& host, std::vector<Task*>& leaving);
  void probe_host(const std::string& host);
  void on_probe_end(const std::string& host, const ChildEnd& end);
  void restart_for_membership();
  void schedule_rejoin(const std::string& host, double delay);
  void try_rejoin(const std::string& host);
  /// try_rejoin, past Slurm's answer about host (leaving: its State, "" usable).
  void rejoin_unless_leaving(const std::string& host, const std::string& leaving);
  double next_rejoin_delay(const std::string& host);
  void on_away_end(Task& task, const EndReading& reading);
  bool on_join_request(const std::string& name, int pid, ReformReplyFn& reply);
  void grow(const std::string& host);
  /// At an attempt's start: tries again each host whose tasks are away.
  void resume_rejoins();
  // Spares (supervisor_spares.cc).
  /// A spare waiting to be promoted on the place of `of` (this machine, or its host).
  Task* ready_spare(const TaskPlan& of);
  void promote(Task& spare, Task& task);
  void on_spare_end(Task& spare, const EndReading& end);
  void answer_spares(const std::string& error);
  // Frozen members (supervisor_freeze.cc, docs/design.md#frozen-workers).
  bool watches_freezes() const;
  void arm_freeze_watch();
  void warn_of_stall(const FreezeVerdict& verdict, const Task* suspect);
  void look_for_freezes();
  void notice_late_members();
  void write_state();
  void update_live_view();
  const char* phase_name() const;

  boost::asio::io_context& io_;
  ProcessSpawner& spawner_;
  RunRecorder& recorder_;
  Console& console_;
  GroupGuardian* guardian_;
  const SupervisorOptions options_;
  const LaunchPlan& plan_;
  RestartBook book_;
  std::vector<std::unique_ptr<Task>> tasks_;
  std::unique_ptr<LoopClock> own_clock_;  ///< the steady clock, when options_ gave none
  LoopClock* clock_;
  double now() const { return clock_->now(); }
  std::unique_ptr<LoopTimer> backoff_timer_, grace_timer_, watchdog_timer_, port_timer_,
      reform_timer_, freeze_timer_;
  FreezeWatch freeze_;  ///< the training tasks' progress (docs/design.md#frozen-workers)
  std::function<void(const SupervisorResult&)> on_done_;
  Phase phase_ = Phase::kStarting;
  int attempt_ = 0;
  int master_port_ = 0;     ///< MASTER_PORT of this attempt: the plan's, or another if it was taken
  std::vector<int> ports_;  ///< each task's port (plan order): the plan's, or re-picked
  std::string cluster_json_;  ///< TF_CONFIG's cluster after a re-pick; "" = the plan's
  int port_retries_ = 0;
  double attempt_started_ = 0;
  double launcher_started_ = 0;
  double last_state_write_ = 0;
  double last_live_view_ = 0;
  double rate_origin_time_ = 0;  ///< first progress of this attempt, for the ETA
  int64_t rate_origin_step_ = -1;
  int64_t reached_step_ = 0;  ///< furthest step any training task reported, over all attempts
  bool recovering_ = false;   ///< a restarted group has not yet said where it resumed
  int generation_ = 0;        ///< DTRAIN_GENERATION of the attempt's next replacement
  std::vector<HeldReform> held_reforms_;  ///< waiting for a failure; at most one per task
  std::optional<PendingInPlace> in_place_recovery_;
  /// The furthest step any reform request said its worker held or had in flight (whole_step,
  /// + 1 when in_flight) since the last recovery: the steps the group redoes are counted from it.
  int64_t reform_furthest_ = -1;
  /// The furthest step reported when the last failure was recovered from in place (-1: none yet
  /// this attempt): a group that stepped past it since made progress.
  int64_t step_at_last_in_place_ = -1;
  std::set<std::string> lost_places_;  ///< hosts and nodes lost during this launch
  bool attempt_made_progress_ = false;
  bool success_ = false;
  bool stop_requested_ = false;
  double teardown_started_ = 0;  ///< monotonic seconds of the last teardown's SIGTERM
  bool grace_extended_ = false;  ///< said, for this teardown, that a save holds the grace
  std::optional<FailureReport> first_failure_;
  /// Names a straggler only when one persists (group_view.h); updated by each snapshot().
  mutable StragglerWatch straggler_watch_;
  std::optional<std::string> fault_;      ///< the launcher's own fault: no restart after it
  std::optional<std::string> log_error_;  ///< a log write failed; on_fault after the handler
  SupervisorResult result_;
  /// Elastic: per host left, the timer of its next try (or of its joiners' gathering) and the
  /// delay of the last try.
  std::map<std::string, std::unique_ptr<LoopTimer>> rejoin_timers_;
  std::map<std::string, double> rejoin_delays_;
  /// The delay the log last announced for each host: a try at the same delay again (a host still
  /// unlisted, a session not ended yet) is a debug line, not one a second in the launcher's log.
  std::map<std::string, double> rejoin_announced_;
  std::vector<MembershipPoint> membership_;  ///< the world size over time (shrinks and growths)
  /// A short program the launcher runs for itself (the host discovery program, a host's probe):
  /// its child (kept until the next run: never released in its own callback), its output, and
  /// its end, read once it has exited and closed its output (the two come apart).
  struct SideRun {
    std::unique_ptr<Child> child;
    std::unique_ptr<LoopTimer> deadline;
    bool running = false, closed = false;
    /// It printed more than its limit: the output kept is cut short (a failed run).
    bool overflowed = false;
    /// It ran past its limit and was abandoned: SIGKILLed, its output closed here.
    bool abandoned = false;
    std::optional<ChildEnd> end;
    std::string output;
  };
  /// Starts request as run (not while it runs; false when it cannot start); done(end) once it
  /// has ended. limit_seconds > 0: SIGKILL after that long. Keeps max_output bytes of output.
  bool start_side_run(SideRun& run, const SpawnRequest& request, const std::string& what,
                      double limit_seconds, size_t max_output,
                      std::function<void(const ChildEnd&)> done);
  std::unique_ptr<LoopTimer> discovery_timer_;
  SideRun discovery_;                                ///< the host discovery program
  std::optional<std::set<std::string>> discovered_;  ///< its last list; unset before one
  /// Elastic command jobs: the tasks not away, renumbered (launch_plan.h members_plan), and each
  /// task's index there; null at full membership.
  std::unique_ptr<LaunchPlan> members_plan_;
  std::map<std::string, size_t> members_index_;
  bool membership_restart_ = false;  ///< this teardown restarts with a new membership
  std::set<std::string> returning_;  ///< hosts that answered a probe, until a worker starts there
  std::map<std::string, int> false_returns_;  ///< answers in a row with no worker started
  std::set<std::string> given_up_;            ///< hosts not tried again
  std::map<std::string, SideRun> probes_;     ///< per host, the last probe
  /// Per Slurm node, the last `scontrol show node` and who waits for its answer.
  struct NodeQuestion {
    SideRun run;
    std::vector<std::function<void(const std::string&)>> waiting;
  };
  std::map<std::string, NodeQuestion> node_questions_;
  /// Failed ends whose decision waits for Slurm's answer about their node, in order of their ends.
  struct HeldEnd {
    Task* task = nullptr;
    EndReading reading;
    ChildEnd end;
  };
  std::vector<HeldEnd> held_ends_;
  std::set<std::string> rejoin_asking_;  ///< hosts whose try waits for Slurm's answer
  /// SIGTERM questions waiting for a stop of the launcher's own, each with its time-out.
  struct SigtermQuestion {
    std::string task;
    int sender = 0;
    ReformReplyFn reply;
    std::unique_ptr<LoopTimer> timer;
  };
  std::vector<std::shared_ptr<SigtermQuestion>> sigterm_questions_;
};

}  // namespace dtrain::launcher
