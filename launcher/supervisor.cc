// See supervisor.h. The life of an attempt: start_attempt -> (output, exits, heartbeats) ->
// first failure -> begin_teardown -> teardown_complete -> back-off -> start_attempt, or finish.
#include "launcher/supervisor.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/ports.h"
#include "launcher/agent_protocol.h"
#include "launcher/supervisor_slot.h"
#include "launcher/torch_env.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {
namespace {
constexpr double kPortRetrySeconds = 0.25;
constexpr int kPortRetries = 40;
constexpr double kStateWriteInterval = 1.0;

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.0, s)));
}
}  // namespace

Supervisor::Supervisor(boost::asio::io_context& io, ProcessSpawner& spawner, RunRecorder& recorder,
                       Console& console, GroupGuardian* guardian, SupervisorOptions options)
    : io_(io),
      spawner_(spawner),
      recorder_(recorder),
      console_(console),
      guardian_(guardian),
      options_(std::move(options)),
      book_(options_.context.spec->restart, options_.jitter_seed),
      backoff_timer_(io),
      grace_timer_(io),
      watchdog_timer_(io),
      port_timer_(io),
      keepalive_timer_(io),
      start_timer_(io),
      attempt_(options_.first_attempt) {
  const common::ClusterSpec& cluster = options_.context.cluster;
  for (const common::TaskId& task : cluster.tasks()) slots_.push_back(make_slot(task));
}

Supervisor::~Supervisor() = default;

std::unique_ptr<Supervisor::Slot> Supervisor::make_slot(const common::TaskId& task) {
  auto slot = std::make_unique<Slot>();
  slot->task = task;
  slot->address = options_.context.cluster.address(task);
  slot->log_path = recorder_.run_dir().log_file(task);
  slot->trains = options_.context.cluster.ring_rank(task).has_value();
  if (options_.context.slurm)
    slot->agent_place =
        "node " + options_.context.slurm->tasks.at(static_cast<size_t>(task.index)).node;
  else if (uses_agent(options_.context, task))
    slot->agent_place = "host " + common::parse_host_port(slot->address, task.text()).host;
  Slot* raw = slot.get();
  slot->splitter = std::make_unique<LineSplitter>([this, raw](std::string_view line) {
    if (!raw->agent_place.empty() && agent_line(*raw, line)) return;
    raw->pending.append(line);
    raw->remember(line);
    console_.print_line(raw->task, line);
  });
  return slot;
}

// A remote agent's marker line: a worker's control message (heartbeat, progress) or an agent
// event. True when line was one (it goes to no log).
bool Supervisor::agent_line(Slot& slot, std::string_view line) {
  AgentLine parsed = classify_agent_line(line);
  if (parsed.kind == AgentLine::Kind::kOutput) return false;
  if (parsed.kind == AgentLine::Kind::kControl) {
    if (auto message = common::parse_control_message(parsed.payload)) on_control_message(*message);
    return true;
  }
  std::optional<AgentEvent> event = parse_agent_event(parsed.payload);
  if (event && event->type == "started") {
    slot.agent_started = true;
    recorder_.event("remote_start", [&](common::JsonWriter& w) {
      w.key("task").value(slot.task.text()).key("remote_pid").value(event->pid);
    });
  }
  if (event && event->type == "exit") slot.agent_reported_exit = true;
  if (event && event->type == "signaled") on_agent_signaled(slot, event->signal);
  return true;
}

// Someone other than the launcher signalled a remote agent: a host shutting down (the worker
// saves and exits 143, a preemption the group recovers from), or Slurm ending the job's steps
// (preemption, the time limit's warning, `scancel --signal`). Slurm's allocation is going away,
// so the launch stops there and exits 143 for the batch script to requeue the job.
void Supervisor::on_agent_signaled(Slot& slot, int sig) {
  recorder_.event("remote_signal", [&](common::JsonWriter& w) {
    w.key("task")
        .value(slot.task.text())
        .key("signal")
        .value(signal_name(sig))
        .key("attempt")
        .value(attempt_);
  });
  if (!options_.context.slurm || stop_requested_) return;
  spdlog::warn(
      "{}: Slurm sent {} to its step (preemption, time limit or scancel): the workers "
      "save a checkpoint and the launch ends with {} so the job can be requeued",
      slot.task.text(), signal_name(sig), common::kExitPreempted);
  stop(sig);
}

void Supervisor::start(std::function<void(const SupervisorResult&)> on_done) {
  on_done_ = std::move(on_done);
  launcher_started_ = common::monotonic_seconds();
  guarded("start", [this] {
    start_attempt();
    arm_keepalive();
  });
}

void Supervisor::arm_keepalive() {
  keepalive_timer_.expires_after(seconds(kAgentKeepaliveInterval));
  keepalive_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || phase_ == Phase::kDone) return;
    guarded("keep-alive timer", [this] {
      for (auto& slot : slots_)
        if (!slot->agent_place.empty() && slot->child && !slot->exited)
          slot->child->signal_group(0);
      arm_keepalive();
    });
  });
}

void Supervisor::start_attempt() {
  phase_ = Phase::kStarting;
  rate_origin_step_ = -1;
  first_failure_.reset();
  success_ = false;
  attempt_made_progress_ = false;
  if (!ports_free_or_retry()) return;
  port_retries_ = 0;
  attempt_started_ = common::monotonic_seconds();
  for (auto& slot : slots_) {
    try {
      spawn_slot(*slot);
    } catch (const common::ConfigError& e) {
      fail_first(*slot, Outcome::kConfigError, e.what(), common::kExitConfig);
      return begin_teardown("a worker could not be started");
    } catch (const common::IoError& e) {
      fail_first(*slot, Outcome::kFailed, e.what(), common::kExitFailure);
      return begin_teardown("a worker could not be started");
    }
  }
  phase_ = Phase::kRunning;
  spdlog::info("attempt {}: {} task(s) running", attempt_, slots_.size());
  write_state();
  arm_watchdog();
  arm_start_check();
}

void Supervisor::arm_start_check() {
  if (!(options_.context.spec->restart.startup_seconds > 0)) return;  // 0: no start check
  start_timer_.expires_after(seconds(options_.context.spec->restart.startup_seconds));
  start_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("start check", [this] { check_agents_started(); });
  });
}

void Supervisor::check_agents_started() {
  if (phase_ != Phase::kRunning) return;
  for (auto& slot : slots_) {
    if (slot->agent_place.empty() || slot->agent_started || slot->exited) continue;
    std::string what = fmt::format(
        "not started on {} within {:g} s (restart.startup_seconds): the {} did not reach `dtrain "
        "agent` there",
        slot->agent_place, options_.context.spec->restart.startup_seconds,
        options_.context.slurm ? "job step (srun waiting for resources?)"
                               : "remote shell (unreachable, or asking for a password?)");
    spdlog::warn("{} {}", slot->task.text(), what);
    recorder_.event("start_timeout", [&](common::JsonWriter& w) {
      w.key("task").value(slot->task.text()).key("attempt").value(attempt_);
    });
    fail_first(*slot, Outcome::kFailed, what, common::kExitFailure);
    return begin_teardown(fmt::format("{} did not start", slot->task.text()));
  }
}

// Every local worker port, and MASTER_PORT when the chief is local, must be free before a start.
bool Supervisor::ports_free_or_retry() {
  LaunchContext& c = options_.context;
  struct Needed {
    common::HostPort where;
    std::string who;
  };
  std::vector<Needed> needed;
  for (auto& slot : slots_)
    needed.push_back(
        {common::parse_host_port(slot->address, slot->task.text()), slot->task.text()});
  if (master_is_local(c) && c.master_port > 0) {
    common::TaskId chief = c.cluster.chief();
    needed.push_back(
        {{common::parse_host_port(c.cluster.address(chief), chief.text()).host, c.master_port},
         "MASTER_PORT"});
  }
  for (const Needed& n : needed) {
    if (!is_local_host(n.where.host) || common::is_port_free(n.where.host, n.where.port)) continue;
    if (n.who == "MASTER_PORT" && !c.spec->master_port) {  // ours to pick again
      c.master_port = choose_master_port(c);
      spdlog::info("MASTER_PORT {} was taken; picked {}", n.where.port, c.master_port);
      continue;
    }
    // On the first start a busy port is the user's to fix; on a restart it may be our own
    // previous worker still letting go of it.
    if (attempt_ > options_.first_attempt && port_retries_++ < kPortRetries) {
      port_timer_.expires_after(seconds(kPortRetrySeconds));
      port_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (!ec && phase_ == Phase::kStarting) guarded("port retry", [this] { start_attempt(); });
      });
      return false;
    }
    bool v6 = n.where.host.find(':') != std::string::npos;
    std::string what = fmt::format("port {}{}{}:{} of {} is in use by another program ({})",
                                   v6 ? "[" : "", n.where.host, v6 ? "]" : "", n.where.port, n.who,
                                   n.who == "MASTER_PORT" ? "free it or change master_port"
                                                          : "free it or change the job's cluster");
    finish(common::kStatusFailed, common::kExitConfig, what);
    return false;
  }
  return true;
}

void Supervisor::spawn_slot(Slot& slot) {
  slot.log.reset(::open(slot.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!slot.log.valid()) {
    throw common::IoError(fmt::format("cannot open {}: {}", slot.log_path, std::strerror(errno)));
  }
  SpawnRequest request = make_spawn_request(options_.context, slot.task, attempt_);
  ChildCallbacks callbacks;
  callbacks.on_output = [this, &slot](std::string_view bytes) {
    guarded("output", [&] { on_output(slot, bytes); });
  };
  callbacks.on_output_closed = [this, &slot] {
    guarded("end of output", [&] { on_output_closed(slot); });
  };
  callbacks.on_exit = [this, &slot](ExitStatus status) {
    guarded("exit", [&] { on_exit(slot, status); });
  };
  slot.status.reset();
  slot.last_lines.clear();
  slot.progress.reset();
  slot.agent_reported_exit = false;
  slot.agent_started = false;
  slot.child = spawner_.spawn(request, std::move(callbacks));
  slot.pid = slot.child->pid();
  slot.exited = false;
  slot.output_open = true;
  slot.last_progress = common::monotonic_seconds();
  if (guardian_) guardian_->watch(slot.pid);
  append_to_log(
      slot, common::attempt_header(attempt_, slot.task, slot.pid, common::utc_timestamp()) + "\n");
  recorder_.event("spawn", [&](common::JsonWriter& w) {
    w.key("task").value(slot.task.text()).key("pid").value(slot.pid).key("attempt").value(attempt_);
  });
}

// A log that cannot be written is the launcher's fault (a full disk): guarded() reports the
// first such error once the handler is done.
void Supervisor::append_to_log(Slot& slot, const std::string& text) {
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(slot.log.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (!log_error_)
        log_error_ = fmt::format("cannot write {}: {}", slot.log_path,
                                 n < 0 ? std::strerror(errno) : "nothing written");
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void Supervisor::on_output(Slot& slot, std::string_view bytes) {
  slot.splitter->feed(bytes);
  if (!slot.pending.empty()) {
    append_to_log(slot, slot.pending);
    slot.pending.clear();
    if (!options_.context.spec->command.empty()) note_progress(slot);
  }
  console_.flush();
}

void Supervisor::on_output_closed(Slot& slot) {
  slot.splitter->finish();
  if (!slot.pending.empty()) {
    // A last line without a newline is kept whole; the newline keeps the next header apart.
    slot.pending += '\n';
    append_to_log(slot, slot.pending);
    slot.pending.clear();
  }
  console_.flush();
  slot.output_open = false;
  maybe_teardown_complete();
}

void Supervisor::on_exit(Slot& slot, ExitStatus status) {
  slot.exited = true;
  slot.status = status;
  Outcome outcome = classify(status);
  // The agent's session ended before the agent said how the worker ended: srun could not start
  // the step or lost the node (any such end while the group runs), or ssh could not reach the
  // host, was refused or lost it (its own code, 255).
  bool slurm = options_.context.slurm.has_value();
  bool live = phase_ == Phase::kRunning || phase_ == Phase::kStarting;
  if (!slot.agent_place.empty() && !slot.agent_reported_exit &&
      (slurm ? live : !status.signaled && status.code == 255)) {
    spdlog::warn("{}: lost {}: the {} ended ({}) before the worker's end was reported ({})",
                 slot.task.text(), slot.agent_place, slurm ? "job step" : "remote shell",
                 describe(status),
                 slurm ? "srun could not start the step, or the node was lost"
                       : "unreachable, authentication refused, or the connection dropped");
    recorder_.event("lost_host", [&](common::JsonWriter& w) {
      w.key("task")
          .value(slot.task.text())
          .key("host")
          .value(slot.agent_place.substr(slot.agent_place.find(' ') + 1));
    });
  }
  recorder_.event("exit", [&](common::JsonWriter& w) {
    w.key("task")
        .value(slot.task.text())
        .key("pid")
        .value(slot.pid)
        .key("attempt")
        .value(attempt_)
        .key("outcome")
        .value(outcome_name(outcome))
        .key("status")
        .value(describe(status));
    if (status.signaled)
      w.key("signal").value(signal_name(status.signal));
    else
      w.key("exit_code").value(status.code);
  });
  if (phase_ == Phase::kRunning || phase_ == Phase::kStarting) {
    if (outcome == Outcome::kSuccess) {
      spdlog::info("{} finished", slot.task.text());
      if (group_succeeded()) {
        success_ = true;
        begin_teardown("every training task finished");
      }
    } else {
      spdlog::warn("{} {} ({}) on attempt {}", slot.task.text(), outcome_name(outcome),
                   describe(status), attempt_);
      fail_first(slot, outcome, describe(status), job_exit_code(status));
      begin_teardown(fmt::format("{} {}", slot.task.text(), outcome_name(outcome)));
    }
  }
  write_state();
  maybe_teardown_complete();
}

void Supervisor::note_progress(Slot& slot) {
  slot.last_progress = common::monotonic_seconds();
  attempt_made_progress_ = true;
}

void Supervisor::on_control_message(const common::ControlMessage& message) {
  if (message.attempt != attempt_) return;  // a late word from an earlier attempt
  guarded("control message", [&] {
    for (auto& slot : slots_) {
      if (slot->task.text() != message.task || slot->exited) continue;
      note_progress(*slot);
      if (message.type == "progress") slot->progress = message;
    }
    if (common::monotonic_seconds() - last_state_write_ >= kStateWriteInterval) write_state();
    update_live_view();
  });
}

// One line for the whole group, from the chief's progress: epoch, step, loss, accuracy,
// samples/s and ETA (from the step rate seen since this attempt's first report).
void Supervisor::update_live_view() {
  double now = common::monotonic_seconds();
  if (now - last_live_view_ < (console_.interactive() ? 0.2 : 10.0)) return;
  common::TaskId chief = options_.context.cluster.chief();
  for (const auto& slot : slots_) {
    if (!(slot->task == chief) || !slot->progress) continue;
    const common::ControlMessage& p = *slot->progress;
    if (!p.epoch || !p.epochs || !p.step || !p.steps) return;
    int64_t done = int64_t{*p.epoch - 1} * *p.steps + *p.step,
            total = int64_t{*p.epochs} * *p.steps;
    if (rate_origin_step_ < 0 || done < rate_origin_step_)
      rate_origin_step_ = done, rate_origin_time_ = now;
    double rate =
        now > rate_origin_time_ ? (done - rate_origin_step_) / (now - rate_origin_time_) : 0;
    std::string eta = rate > 0 ? fmt::format("{:.0f}s", (total - done) / rate) : "?";
    last_live_view_ = now;
    console_.set_status(
        fmt::format("attempt {}  epoch {}/{}  step {}/{}  loss {:.4f}  accuracy {:.4f}  {:.0f} "
                    "samples/s  ETA {}",
                    attempt_, *p.epoch, *p.epochs, *p.step, *p.steps, p.loss.value_or(0),
                    p.accuracy.value_or(0), p.samples_per_second.value_or(0), eta));
  }
}

bool Supervisor::group_succeeded() const {
  bool chief_only = options_.context.spec->success == common::SuccessRule::kChiefOnly;
  common::TaskId chief = options_.context.cluster.chief();
  for (const auto& slot : slots_) {
    if (!slot->trains || (chief_only && !(slot->task == chief))) continue;
    if (!slot->status || classify(*slot->status) != Outcome::kSuccess) return false;
  }
  return true;
}

void Supervisor::fail_first(const Slot& slot, Outcome outcome, const std::string& what, int code) {
  if (first_failure_) return;
  first_failure_ = failure_of(slot, outcome, what, code);
}

void Supervisor::begin_teardown(const std::string& reason) {
  if (phase_ == Phase::kTearingDown || phase_ == Phase::kDone) return;
  phase_ = Phase::kTearingDown;
  watchdog_timer_.cancel();
  start_timer_.cancel();
  recorder_.event("teardown", [&](common::JsonWriter& w) {
    w.key("attempt").value(attempt_).key("reason").value(reason);
  });
  signal_all(SIGTERM);
  grace_timer_.expires_after(seconds(options_.context.spec->restart.grace_seconds));
  grace_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    guarded("grace timer", [this] { kill_now(); });
  });
  write_state();
  maybe_teardown_complete();
}

// Sends sig to every group that may still hold a process: running workers, and exited ones
// whose output is still open (a grandchild holds it).
void Supervisor::signal_all(int sig) {
  for (auto& slot : slots_) {
    if (slot->child && (!slot->exited || slot->output_open)) slot->child->signal_group(sig);
  }
  recorder_.event("signal", [&](common::JsonWriter& w) {
    w.key("signal").value(signal_name(sig)).key("attempt").value(attempt_);
  });
}

void Supervisor::kill_now() {
  guarded("kill", [&] {
    if (phase_ != Phase::kTearingDown && phase_ != Phase::kRunning && phase_ != Phase::kStarting)
      return;
    killed_ = true;
    signal_all(SIGKILL);
    // After SIGKILL, output closes at once unless something outside the group holds the pipe.
    grace_timer_.expires_after(seconds(options_.kill_drain_seconds));
    grace_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      guarded("drain timer", [this] {
        for (auto& slot : slots_) {
          if (slot->output_open)
            spdlog::warn("{}: output still open after SIGKILL; giving up on it", slot->task.text());
          slot->output_open = false;
        }
        maybe_teardown_complete();
      });
    });
    if (phase_ != Phase::kTearingDown) begin_teardown("killed");
  });
}

void Supervisor::maybe_teardown_complete() {
  if (phase_ != Phase::kTearingDown) return;
  for (const auto& slot : slots_) {
    if (slot->child && (!slot->exited || slot->output_open)) return;
  }
  teardown_complete();
}

void Supervisor::teardown_complete() {
  grace_timer_.cancel();
  for (auto& slot : slots_) {
    if (guardian_ && slot->child) guardian_->forget(slot->pid);
    slot->child.reset();
  }
  if (fault_) return finish(common::kStatusFailed, common::kExitFailure, "launcher: " + *fault_);
  if (stop_requested_)
    return finish(common::kStatusStopped, common::kExitPreempted, "stopped by a signal");
  if (success_)
    return finish(common::kStatusSucceeded, common::kExitSuccess, "every training task finished");
  DT_ENFORCE(first_failure_.has_value(), "a group stopped with neither success nor a failure");
  blame_disk_full();
  double ran = common::monotonic_seconds() - attempt_started_;
  bool progressed = attempt_made_progress_ || ran >= options_.context.spec->restart.startup_seconds;
  Decision decision = book_.decide({first_failure_->outcome, progressed, ran});
  if (!decision.restart)
    return finish(common::kStatusFailed, first_failure_->exit_code, decision.reason);
  phase_ = Phase::kBackingOff;
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
        .value(book_.preemptions());
  });
  spdlog::info(
      "restarting the group in {:.2f} s (attempt {}; {} failure restart(s), {} preemption(s))",
      decision.delay_seconds, attempt_ + 1, book_.restarts(), book_.preemptions());
  write_state();
  backoff_timer_.expires_after(seconds(decision.delay_seconds));
  backoff_timer_.async_wait([this](const boost::system::error_code& ec) {
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
    switch (phase_) {
      case Phase::kBackingOff:
        backoff_timer_.cancel();
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

void Supervisor::finish(const std::string& status, int exit_code, const std::string& reason) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  for (auto* timer : {&backoff_timer_, &grace_timer_, &watchdog_timer_, &port_timer_,
                      &keepalive_timer_, &start_timer_})
    timer->cancel();
  result_ = SupervisorResult{status, exit_code, reason, first_failure_};
  if (status == common::kStatusSucceeded) result_.failure.reset();
  recorder_.release_reserve();  // the workers are gone: the last records may use it
  recorder_.event("end", [&](common::JsonWriter& w) {
    w.key("status").value(status).key("exit_code").value(exit_code).key("reason").value(reason);
  });
  write_state();
  if (on_done_) on_done_(result_);
}

void Supervisor::arm_watchdog() {
  std::optional<double> hang = options_.context.spec->hang_timeout_seconds;
  if (!hang) return;
  watchdog_timer_.expires_after(seconds(std::min(1.0, *hang / 4)));
  watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("watchdog", [this] { check_watchdog(); });
  });
}

void Supervisor::check_watchdog() {
  if (phase_ != Phase::kRunning) return;
  double hang = *options_.context.spec->hang_timeout_seconds;
  double now = common::monotonic_seconds();
  for (auto& slot : slots_) {
    if (slot->exited || now - slot->last_progress < hang) continue;
    std::string what = fmt::format("hung: no progress for {:.1f} s", now - slot->last_progress);
    spdlog::warn("{} {}", slot->task.text(), what);
    recorder_.event("hang", [&](common::JsonWriter& w) {
      w.key("task").value(slot->task.text()).key("attempt").value(attempt_);
    });
    fail_first(*slot, Outcome::kFailed, what, common::kExitFailure);
    return begin_teardown(fmt::format("{} hung", slot->task.text()));
  }
  arm_watchdog();
}

}  // namespace dtrain::launcher
