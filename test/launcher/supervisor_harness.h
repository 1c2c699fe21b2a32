// A Supervisor over the fake spawner (test/launcher/fake_spawner.h), reached through the agent
// spawner as in the launcher, on a job parsed from text, in a temporary run directory. run()
// drives the io_context until the job ends. Shared by the supervisor's unit tests. Time is
// simulated (test/launcher/sim_clock.h): the supervisor, the remote children and the scripts
// share one clock that jumps from timer to timer, so a test asserts order and outcome, and its
// result does not depend on how busy the machine is. Programs a test names as real programs (a
// fake scontrol first on PATH) run as real processes, and the job then runs on real time.
#pragma once

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "common/atomic_file.h"
#include "common/control_protocol.h"
#include "common/job_spec.h"
#include "common/run_dir.h"
#include "launcher/placement/remote_child.h"
#include "launcher/supervisor/supervisor.h"
#include "test/launcher/fake_spawner.h"
#include "test/launcher/sim_clock.h"
#include "test/support/temp_dir.h"

namespace dtrain::testing {

struct SupervisorHarness {
  /// Changes a test makes before the supervisor is built; each may be empty.
  struct Setup {
    std::function<void(common::RestartPolicy&)> restart;
    /// Runs on the run directory before the recorder opens its files.
    std::function<void(const common::RunDir&)> prepare;
    std::function<void(launcher::LaunchContext&)> context;
    std::function<void(launcher::LaunchPlan&)> plan;
    std::function<void(launcher::SupervisorOptions&)> options;
  };

  /// Sends the real programs' requests to the real spawner, the rest to the fake.
  class SplitSpawner : public launcher::ProcessSpawner {
   public:
    SplitSpawner(boost::asio::io_context& io, launcher::ProcessSpawner& fake,
                 std::set<std::string> real)
        : real_spawner_(launcher::make_local_spawner(io)), fake_(fake), real_(std::move(real)) {}
    std::unique_ptr<launcher::Child> spawn(const launcher::SpawnRequest& request,
                                           launcher::ChildCallbacks callbacks) override {
      bool real = !request.agent() && !request.argv.empty() && real_.count(request.argv[0]);
      return (real ? *real_spawner_ : fake_).spawn(request, std::move(callbacks));
    }

   private:
    std::unique_ptr<launcher::ProcessSpawner> real_spawner_;
    launcher::ProcessSpawner& fake_;
    std::set<std::string> real_;
  };

  /// Local requests whose argv[0] is one of real_programs start real processes (the real
  /// spawner), not the fake's script.
  SupervisorHarness(const std::string& job_json, FakeSpawner::Script script,
                    const Setup& setup = {}, const std::set<std::string>& real_programs = {})
      : spec(common::parse_job_spec(job_json, "job.json")),
        spawner(io, std::move(script)),
        run_dir(dir.path()),
        console_file(std::tmpfile()),
        console(console_file, false) {
    if (setup.restart) setup.restart(spec.restart);
    std::filesystem::create_directories(run_dir.logs_dir());
    if (setup.prepare) setup.prepare(run_dir);
    recorder = std::make_unique<launcher::RunRecorder>(run_dir);
    launcher::LaunchContext c;
    c.spec = &spec;
    c.cluster = common::resolve_cluster(spec);
    c.run_dir = dir.path();
    if (setup.context) setup.context(c);
    launcher::LaunchPlan plan = launcher::plan_launch(c);
    if (setup.plan) setup.plan(plan);
    in_place = plan.in_place;
    launcher::SupervisorOptions options{std::move(plan), 0, 1, 0.5};
    if (setup.options) setup.options(options);
    launcher::ProcessSpawner* inner = &spawner;
    if (!real_programs.empty()) {
      split = std::make_unique<SplitSpawner>(io, spawner, real_programs);
      inner = split.get();
      steady = launcher::make_steady_clock(io);
      clock = steady.get();
    } else {
      sim = std::make_unique<SimClock>(io);
      clock = sim.get();
    }
    options.clock = clock;
    spawner.set_clock(clock);
    agents = launcher::make_agent_spawner(io, *inner, clock);
    supervisor = std::make_unique<launcher::Supervisor>(io, *agents, *recorder, console, nullptr,
                                                        std::move(options));
  }
  ~SupervisorHarness() { std::fclose(console_file); }
  SupervisorHarness(const SupervisorHarness&) = delete;
  SupervisorHarness& operator=(const SupervisorHarness&) = delete;

  /// Runs the job to its end, within seconds of the job's time (simulated, or real with real
  /// programs); a job still running then fails the test.
  launcher::SupervisorResult run(double seconds = 20) {
    supervisor->start([this](const launcher::SupervisorResult& r) {
      result = r;
      done = true;
      io.stop();
    });
    if (sim) {
      const double limit = sim->now() + seconds;
      while (!done) {
        io.restart();
        if (io.poll() > 0) continue;
        // Nothing to do now: time moves to the next timer.
        if (sim->now() >= limit || !sim->advance()) break;
      }
    } else {
      io.run_for(std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(seconds)));
    }
    REQUIRE(done);
    return result;
  }
  /// Runs body on the loop seconds from now, on the job's clock.
  void after(double seconds, std::function<void()> body) {
    timers.push_back(run_after(*clock, seconds, std::move(body)));
  }
  int spawns_of_attempt(int attempt) const {
    int n = 0;
    for (const auto& p : spawner.processes) n += p->attempt() == attempt ? 1 : 0;
    return n;
  }
  std::string events() const { return common::read_file(run_dir.events_jsonl()); }
  std::string state() const { return common::read_file(run_dir.state_json()); }
  bool has_event(const std::string& kind) const {
    return events().find("\"event\":\"" + kind + "\"") != std::string::npos;
  }

  TempDir dir;
  boost::asio::io_context io;
  std::unique_ptr<SimClock> sim;                             ///< without real programs
  std::unique_ptr<launcher::LoopClock> steady;               ///< with them
  launcher::LoopClock* clock = nullptr;                      ///< the one in use
  std::vector<std::shared_ptr<launcher::LoopTimer>> timers;  ///< after()'s
  common::JobSpec spec;
  FakeSpawner spawner;
  common::RunDir run_dir;
  std::FILE* console_file;
  launcher::Console console;
  std::unique_ptr<launcher::RunRecorder> recorder;
  std::unique_ptr<SplitSpawner> split;  ///< set when real programs are named
  std::unique_ptr<launcher::ProcessSpawner> agents;
  std::unique_ptr<launcher::Supervisor> supervisor;
  launcher::SupervisorResult result;
  bool done = false;
  bool in_place = false;  ///< the plan's
};

/// A reform reply's line, parsed (a test failure when it is not one).
inline common::ReformReply reform_reply(const std::string& line) {
  std::optional<common::ReformReply> reply = common::parse_reform_reply(line);
  REQUIRE(reply);
  return *reply;
}

}  // namespace dtrain::testing
