// See remote_child.h. A RemoteChild sits between the local child (the remote shell or srun
// process) and the supervisor's callbacks: output lines pass through whole, marker lines become
// calls, and the session's end becomes the worker's end or the loss of its place.
#include "launcher/placement/remote_child.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <csignal>
#include <string>

#include "common/clock.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/process/line_splitter.h"

namespace dtrain::launcher {
namespace {

/// How long a SIGKILL sent through the agent may take before the session is closed from here.
constexpr double kHardKillSeconds = 2.0;

class RemoteChild : public Child {
  // A timer handler that does nothing once the child is gone or the wait was cancelled.
  template <class F>
  auto guard(F body) {
    return [alive = std::weak_ptr<bool>(alive_), body](const boost::system::error_code& ec) {
      auto locked = alive.lock();
      if (!ec && locked && *locked) body();
    };
  }

 public:
  RemoteChild(LoopClock& clock, RemoteTarget target, ChildCallbacks outer)
      : target_(std::move(target)),
        outer_(std::move(outer)),
        clock_(clock),
        keepalive_(clock.make_timer()),
        start_timer_(clock.make_timer()),
        hard_kill_(clock.make_timer()),
        splitter_([this](std::string_view line) { on_line(line); }, kMaxAgentLine),
        heard_at_(clock.now()) {}

  ~RemoteChild() override {
    *alive_ = false;
    inner_.reset();  // no callback of it runs after this
  }

  void start(ProcessSpawner& local, const SpawnRequest& request) {
    ChildCallbacks mine;
    mine.on_output = [this](std::string_view bytes) { splitter_.feed(bytes); };
    mine.on_output_closed = [this] {
      splitter_.finish();
      if (outer_.on_output_closed) outer_.on_output_closed();
    };
    mine.on_exit = [this](const ChildEnd& end) { on_session_end(end.status); };
    inner_ = local.spawn(request, std::move(mine));
    arm_keepalive();
    if (target_.start_seconds > 0) {
      start_timer_->expires_after(target_.start_seconds);
      start_timer_->async_wait(guard([this] { on_start_timeout(); }));
    }
  }

  int pid() const override { return inner_->pid(); }

  void queue_signal(int sig, int value) override { inner_->queue_signal(sig, value); }

  bool reports_start() const override { return true; }
  int worker_pid() const override { return remote_pid_; }
  std::string sender_refusal(int, const std::string& who) const override {
    return fmt::format("{} runs on {}: it reports through its agent, not here", who, place());
  }
  std::string why_unkillable() const override { return "its remote session did not end"; }

  // What the agent last reported; the record only when it is this worker's (its remote pid).
  MemberObservation look(const std::string&) const override {
    MemberObservation seen = watched_;
    if (seen.record && seen.record->pid != remote_pid_) seen.record.reset();
    seen.silent_seconds = std::max(0.0, clock_.now() - heard_at_);
    return seen;
  }

  // SIGKILL goes to the agent first: the worker's port and files are free once the agent reports
  // its end, which a replacement on the same host needs (killing the session at once would leave
  // the worker to the agent's own teardown, 1.5 s later). A session that has not ended
  // kHardKillSeconds later (a host cut off, an agent that never started) is closed from here.
  void signal_group(int sig) override {
    if (sig != 0) stopping_ = true;  // an end without a report is now the launcher's doing
    if (sig != SIGKILL || !started_ || ended_) return inner_->signal_group(sig);
    inner_->write_agent(format_agent_signal_command(SIGKILL));
    if (hard_kill_armed_) return;
    hard_kill_armed_ = true;
    hard_kill_->expires_after(kHardKillSeconds);
    hard_kill_->async_wait(guard([this] {
      if (!ended_) inner_->signal_group(SIGKILL);
    }));
  }

 private:
  bool slurm() const { return target_.kind == RemoteTarget::Kind::kSlurmStep; }
  std::string place() const { return (slurm() ? "node " : "host ") + target_.name; }

  // Each second a keep-alive ({"signal": 0}): the agent ends the worker when they stop coming.
  void arm_keepalive() {
    keepalive_->expires_after(kAgentKeepaliveInterval);
    keepalive_->async_wait(guard([this] {
      if (ended_) return;
      inner_->signal_group(0);
      arm_keepalive();
    }));
  }

  void on_start_timeout() {
    if (started_ || ended_) return;
    timed_out_ = true;
    inner_->signal_group(SIGKILL);  // closes the session and kills the local remote shell
  }

  // One line of the session's stdout, or a piece of an overlong one: only a line's start may be
  // a marker (agent_protocol.h), and a worker line the agent escaped comes back as it was.
  void on_line(std::string_view line) {
    heard_at_ = clock_.now();
    bool at_line_start = at_line_start_;
    at_line_start_ = !line.empty() && (line.back() == '\n' || line.back() == '\r');
    AgentLine parsed =
        at_line_start ? classify_agent_line(line) : AgentLine{AgentLine::Kind::kOutput, line};
    switch (parsed.kind) {
      case AgentLine::Kind::kOutput: {
        std::string_view text = parsed.payload;
        while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
        if (!text.empty()) last_line_ = text;
        if (outer_.on_output) outer_.on_output(parsed.payload);
        return;
      }
      case AgentLine::Kind::kControl:
        if (outer_.on_control) outer_.on_control(std::string(parsed.payload));
        return;
      case AgentLine::Kind::kEvent:
        return on_event(parsed.payload);
      case AgentLine::Kind::kRequest:
        return on_request(parsed.payload);
    }
  }

  // A worker's request relayed by its agent: answered on the agent's stdin, by id.
  void on_request(std::string_view payload) {
    std::optional<RelayedRequest> request = parse_relayed_request(payload);
    if (!request || !outer_.on_request) return;
    uint64_t id = request->id;
    outer_.on_request(request->json,
                      [alive = std::weak_ptr<bool>(alive_), this, id](const std::string& line) {
                        auto locked = alive.lock();
                        if (locked && *locked && !ended_)
                          inner_->write_agent(format_agent_reply_command(id, line));
                      });
  }

  void on_event(std::string_view payload) {
    std::optional<AgentEvent> event = parse_agent_event(payload);
    if (!event) return;
    switch (event->type) {
      case AgentEvent::Type::kWatch:
        watched_.process = event->process;
        watched_.record = event->record;
        return;
      case AgentEvent::Type::kStarted:
        remote_pid_ = event->pid;
        started_ = true;
        start_timer_->cancel();
        if (outer_.on_started) outer_.on_started(event->pid);
        return;
      case AgentEvent::Type::kExit:
        reported_ = event->status;
        return;
      case AgentEvent::Type::kSignaled:
        // Slurm signals a job's steps when the allocation ends (preemption, time limit, scancel).
        if (outer_.on_signaled) outer_.on_signaled(event->signal, slurm());
        return;
    }
  }

  // The remote shell or srun ended: the worker's end as the agent reported it, else what the
  // session's own end says.
  void on_session_end(const ExitStatus& session) {
    ended_ = true;
    keepalive_->cancel();
    start_timer_->cancel();
    hard_kill_->cancel();
    if (outer_.on_exit) outer_.on_exit(describe_end(session));
  }

  ChildEnd describe_end(const ExitStatus& session) const {
    if (reported_) return *reported_;
    std::string said = last_line_.empty() ? "" : fmt::format(" (it said: {})", last_line_);
    if (timed_out_)
      return {session, ChildEnd::Cause::kNotStarted,
              fmt::format("not started on {} within {:g} s (restart.startup_seconds): the {} did "
                          "not reach `dtrain agent` there{}",
                          place(), target_.start_seconds,
                          slurm() ? "job step (srun waiting for resources?)"
                                  : "remote shell (unreachable, or asking for a password?)",
                          said)};
    if (stopping_) return session;  // ended by the launcher's own signal
    // srun could not start the step or lost the node (any end not asked for), or ssh could not
    // reach the host, was refused or lost it (its own code, 255).
    bool lost = slurm() || (!session.signaled && session.code == 255);
    if (!lost) return session;
    return {session, started_ ? ChildEnd::Cause::kPlaceLost : ChildEnd::Cause::kNotStarted,
            fmt::format("lost {}: the {} ended ({}) before the worker's end was reported: {}{}",
                        place(), slurm() ? "job step" : "remote shell", describe(session),
                        slurm() ? "srun could not start the step, or the node was lost"
                                : "unreachable, authentication refused, or the connection dropped",
                        said)};
  }

  RemoteTarget target_;
  ChildCallbacks outer_;
  LoopClock& clock_;
  std::unique_ptr<LoopTimer> keepalive_, start_timer_, hard_kill_;
  LineSplitter splitter_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::optional<ExitStatus> reported_;  ///< the worker's end, as the agent reported it
  std::string last_line_;               ///< the last output line (ssh's or srun's own error)
  bool at_line_start_ = true;           ///< the next splitter line starts a line of the stream
  MemberObservation watched_;           ///< the agent's last watch event
  int remote_pid_ = 0;                  ///< the worker's pid on its host
  double heard_at_;                     ///< the session's last line, on clock_
  bool started_ = false, ended_ = false, stopping_ = false, timed_out_ = false;
  bool hard_kill_armed_ = false;
  std::unique_ptr<Child> inner_;  ///< last: destroyed first
};

class AgentSpawner : public ProcessSpawner {
 public:
  AgentSpawner(boost::asio::io_context& io, ProcessSpawner& local, LoopClock* clock)
      : own_clock_(clock ? nullptr : make_steady_clock(io)),
        clock_(clock ? *clock : *own_clock_),
        local_(local) {}

  std::unique_ptr<Child> spawn(const SpawnRequest& request, ChildCallbacks callbacks) override {
    if (!request.remote) return local_.spawn(request, std::move(callbacks));
    auto child = std::make_unique<RemoteChild>(clock_, *request.remote, std::move(callbacks));
    child->start(local_, request);
    return child;
  }

 private:
  std::unique_ptr<LoopClock> own_clock_;
  LoopClock& clock_;
  ProcessSpawner& local_;
};

}  // namespace

std::unique_ptr<ProcessSpawner> make_agent_spawner(boost::asio::io_context& io,
                                                   ProcessSpawner& local, LoopClock* clock) {
  return std::make_unique<AgentSpawner>(io, local, clock);
}

}  // namespace dtrain::launcher
