// A ProcessSpawner for unit tests: no processes. Each spawn is handed to a script the test
// writes (exit now, print, hang...), and signals behave like a default handler would: SIGTERM and
// SIGKILL end the fake process, unless it ignores SIGTERM. Callbacks are posted to the io_context,
// never run inside the call that caused them, as with real processes. A script's delays
// (FakeProcess::after) run on the spawner's clock: the harness's simulated one
// (test/launcher/sim_clock.h), so a script's timing and the supervisor's are one time line.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/placement/agent_protocol.h"
#include "launcher/placement/process_spawner.h"
#include "launcher/process/loop_clock.h"

namespace dtrain::testing {

/// Runs body on the loop seconds from now on clock; the timer lives as long as the result.
inline std::shared_ptr<launcher::LoopTimer> run_after(launcher::LoopClock& clock, double seconds,
                                                      std::function<void()> body) {
  std::shared_ptr<launcher::LoopTimer> timer = clock.make_timer();
  timer->expires_after(seconds);
  timer->async_wait([body = std::move(body)](const boost::system::error_code& ec) {
    if (!ec) body();
  });
  return timer;
}

struct FakeProcess {
  boost::asio::io_context* io = nullptr;
  launcher::LoopClock* clock = nullptr;  ///< the spawner's
  launcher::SpawnRequest request;
  launcher::ChildCallbacks callbacks;
  int pid = 0;
  bool ended = false;
  bool ignore_sigterm = false;
  std::vector<int> signals;
  std::vector<std::pair<int, int>> queued;  ///< queue_signal's (signal, value), in order
  std::string agent_input;  ///< what write_agent wrote (an agent session's stdin after the request)
  /// What Child::look shows of it (no process is read: pids here are made up).
  launcher::MemberObservation seen;

  /// A variable the process starts with (for a remote task, from its agent request).
  std::string env(const std::string& name) const {
    std::vector<std::pair<std::string, std::string>> all = request.env;
    if (request.agent())
      all = launcher::parse_agent_request(
                std::string_view(request.agent_request).substr(0, request.agent_request.size() - 1))
                .env;
    for (const auto& [k, v] : all)
      if (k == name) return v;
    return "";
  }
  int attempt() const { return std::stoi(env("DTRAIN_ATTEMPT")); }
  /// The lines the launcher answered its relayed requests with (agent_input's replies), in order.
  std::vector<std::string> replies() const {
    std::vector<std::string> out;
    for (size_t at = 0; at < agent_input.size();) {
      size_t end = agent_input.find('\n', at);
      launcher::AgentCommand command =
          launcher::parse_agent_command(std::string_view(agent_input).substr(at, end - at));
      if (command.kind == launcher::AgentCommand::Kind::kReply) out.push_back(command.line);
      at = end + 1;
    }
    return out;
  }
  /// Runs body on the loop seconds from now on the spawner's clock (while the process lives:
  /// its timers go with it).
  void after(double seconds, std::function<void()> body) {
    timers.push_back(run_after(*clock, seconds, std::move(body)));
  }
  std::vector<std::shared_ptr<launcher::LoopTimer>> timers;
  void print(const std::string& text) {
    boost::asio::post(*io, [this, text] {
      if (callbacks.on_output) callbacks.on_output(text);
    });
  }
  void end(launcher::ExitStatus status) {
    if (ended) return;
    ended = true;
    boost::asio::post(*io, [this, status] {
      if (callbacks.on_exit) callbacks.on_exit(status);
      if (callbacks.on_output_closed) callbacks.on_output_closed();
    });
  }
};

class FakeSpawner : public launcher::ProcessSpawner {
 public:
  using Script = std::function<void(FakeProcess&)>;
  FakeSpawner(boost::asio::io_context& io, Script script)
      : io_(io), script_(std::move(script)), steady_(launcher::make_steady_clock(io)) {}
  /// The clock of the scripts' delays; the steady clock until set. Not owned.
  void set_clock(launcher::LoopClock* clock) { clock_ = clock; }

  std::unique_ptr<launcher::Child> spawn(const launcher::SpawnRequest& request,
                                         launcher::ChildCallbacks callbacks) override {
    auto process = std::make_shared<FakeProcess>();
    process->io = &io_;
    process->clock = clock_ ? clock_ : steady_.get();
    process->request = request;
    process->callbacks = std::move(callbacks);
    process->pid = next_pid_++;
    processes.push_back(process);
    script_(*process);
    return std::make_unique<FakeChild>(process);
  }

  std::vector<std::shared_ptr<FakeProcess>> processes;

 private:
  class FakeChild : public launcher::Child {
   public:
    explicit FakeChild(std::shared_ptr<FakeProcess> p) : p_(std::move(p)) {}
    ~FakeChild() override { p_->callbacks = {}; }
    int pid() const override { return p_->pid; }
    void queue_signal(int sig, int value) override { p_->queued.emplace_back(sig, value); }
    launcher::MemberObservation look(const std::string&) const override { return p_->seen; }
    void write_agent(const std::string& text) override { p_->agent_input += text; }
    void signal_group(int sig) override {
      p_->signals.push_back(sig);
      if (sig == SIGKILL || (sig == SIGTERM && !p_->ignore_sigterm))
        p_->end(launcher::ExitStatus::killed(sig));
    }

   private:
    std::shared_ptr<FakeProcess> p_;
  };

  boost::asio::io_context& io_;
  Script script_;
  std::unique_ptr<launcher::LoopClock> steady_;
  launcher::LoopClock* clock_ = nullptr;
  int next_pid_ = 1000;
};

}  // namespace dtrain::testing
