// The supervisor: starts every task of a job, watches them, and on the first failure stops the
// whole group (SIGTERM to all at once, one shared grace period, then SIGKILL) and starts it again
// after a back-off, as restart_policy decides. One io_context thread, no locks; processes come
// from a ProcessSpawner, so every path runs against a fake in unit tests.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/control_protocol.h"
#include "launcher/console.h"
#include "launcher/group_guardian.h"
#include "launcher/line_splitter.h"
#include "launcher/process_spawner.h"
#include "launcher/restart_policy.h"
#include "launcher/run_records.h"
#include "launcher/worker_env.h"

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
};

struct SupervisorResult {
  std::string status;  ///< common::kStatusSucceeded, kStatusFailed or kStatusStopped
  int exit_code = 0;
  std::string reason;  ///< for a fault of the launcher itself, "launcher: <what failed>"
  std::optional<FailureReport> failure;
};

struct SupervisorOptions {
  LaunchContext context;
  int first_attempt = 0;
  uint64_t jitter_seed = 0;
  double kill_drain_seconds = 5;  ///< after SIGKILL, how long to wait for output to close
};

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
  /// A heartbeat or progress line from a worker (DTRAIN_CONTROL).
  void on_control_message(const common::ControlMessage& message);
  /// A fault of the launcher's own (a write that failed, an exception in a handler): logs it,
  /// stops the group as a failure with no restart, and ends the job "failed" with reason
  /// "launcher: <what>". Every handler's exceptions end here; it throws nothing.
  void on_fault(const std::string& what) noexcept;

  int attempt() const { return attempt_; }
  /// What state.json holds, as one JSON line (also the reply to `dtrain status`).
  std::string state_json() const;
  /// Restarts, preemptions, attempt, and per worker up, loss, samples/s and step, in
  /// Prometheus's text format.
  std::string prometheus_text() const;
  const RestartBook& book() const { return book_; }

 private:
  struct Slot;
  bool agent_line(Slot& slot, std::string_view line);
  void on_agent_signaled(Slot& slot, int sig);
  enum class Phase { kStarting, kRunning, kTearingDown, kBackingOff, kDone };

  /// Runs the body of an Asio handler (child callback, timer, request) so that nothing escapes
  /// into the loop: an exception, or a write that failed meanwhile, goes to on_fault.
  void guarded(const char* handler, const std::function<void()>& body) noexcept;
  /// Last resort when stopping cleanly threw too: SIGKILL every group and end the job.
  void emergency_stop(const std::string& what) noexcept;
  /// A task whose last lines say the disk is full takes the blame from one that failed first
  /// without saying why (it lost its peer, or its write failed silently).
  void blame_disk_full();
  FailureReport failure_of(const Slot& slot, Outcome outcome, const std::string& what,
                           int exit_code) const;
  void start_attempt();
  bool ports_free_or_retry();
  void spawn_slot(Slot& slot);
  void append_to_log(Slot& slot, const std::string& text);
  void on_output(Slot& slot, std::string_view bytes);
  void on_output_closed(Slot& slot);
  void on_exit(Slot& slot, ExitStatus status);
  void note_progress(Slot& slot);
  bool group_succeeded() const;
  void fail_first(const Slot& slot, Outcome outcome, const std::string& what, int exit_code);
  void begin_teardown(const std::string& reason);
  void signal_all(int sig);
  void maybe_teardown_complete();
  void teardown_complete();
  void finish(const std::string& status, int exit_code, const std::string& reason);
  void arm_watchdog();
  /// Each second, a keep-alive to every remote agent (they stop their worker without one).
  void arm_keepalive();
  void check_watchdog();
  void write_state();
  void update_live_view();
  const char* phase_name() const;
  std::unique_ptr<Slot> make_slot(const common::TaskId& task);

  boost::asio::io_context& io_;
  ProcessSpawner& spawner_;
  RunRecorder& recorder_;
  Console& console_;
  GroupGuardian* guardian_;
  SupervisorOptions options_;
  RestartBook book_;
  std::vector<std::unique_ptr<Slot>> slots_;
  /// startup_seconds after a start: a worker whose agent has not started it yet (ssh still
  /// connecting, srun waiting for resources) is a start failure, not a hang.
  void arm_start_check();
  void check_agents_started();
  boost::asio::steady_timer backoff_timer_, grace_timer_, watchdog_timer_, port_timer_,
      keepalive_timer_, start_timer_;
  std::function<void(const SupervisorResult&)> on_done_;
  Phase phase_ = Phase::kStarting;
  int attempt_ = 0;
  int port_retries_ = 0;
  double attempt_started_ = 0;
  double launcher_started_ = 0;
  double last_state_write_ = 0;
  double last_live_view_ = 0;
  double rate_origin_time_ = 0;  ///< first progress of this attempt, for the ETA
  int64_t rate_origin_step_ = -1;
  bool attempt_made_progress_ = false;
  bool success_ = false;
  bool stop_requested_ = false;
  bool killed_ = false;
  std::optional<FailureReport> first_failure_;
  std::optional<std::string> fault_;      ///< the launcher's own fault: no restart after it
  std::optional<std::string> log_error_;  ///< a log write failed; on_fault after the handler
  SupervisorResult result_;
};

}  // namespace dtrain::launcher
