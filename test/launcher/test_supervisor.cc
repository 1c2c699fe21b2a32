// Every restart path of the supervisor against the fake spawner: restart after a failure,
// configuration errors, preemption, budgets, the "silent failures" rule, crashes, hangs, the
// shared grace period, stopping on a launcher signal, and the launcher's own faults (an exception
// in a handler, a record or log it cannot write).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/control_protocol.h"
#include "common/job_spec.h"
#include "common/run_dir.h"
#include "launcher/placement/remote_child.h"
#include "launcher/supervisor/supervisor.h"
#include "test/launcher/fake_spawner.h"
#include "test/launcher/supervisor_harness.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
using launcher::ExitStatus;
using testing::FakeProcess;

namespace {

using Tweak = std::function<void(common::RestartPolicy&)>;

std::string job_json(const std::string& extra) {
  std::string workers = extra.find("\"cluster\"") == std::string::npos ? R"("workers": 2, )" : "";
  return R"({"job": "fake", )" + workers + R"("command": ["fake"], "restart": {"max_restarts": 2,
     "grace_seconds": 0.2,
    "startup_seconds": 0, "max_preemptions": 5, "backoff_seconds": 0.01,
    "backoff_max_seconds": 0.05})" +
         extra + "}";
}

struct Harness : testing::SupervisorHarness {
  /// extra: more top-level keys (", \"k\": v"); tweak: changes to the restart policy; prepare:
  /// runs on the run directory before the recorder opens its files; master_port: MASTER_PORT.
  Harness(const std::string& extra, testing::FakeSpawner::Script script, const Tweak& tweak = {},
          const std::function<void(const common::RunDir&)>& prepare = {}, int master_port = 0)
      : SupervisorHarness(
            job_json(extra), std::move(script),
            {tweak,
             prepare,
             {},
             [master_port](launcher::LaunchPlan& plan) { plan.master_port = master_port; },
             {}}) {}
};

bool is(const FakeProcess& p, const char* task) {
  return p.env("TF_CONFIG").find(std::string("\"index\": ") + task) != std::string::npos;
}

}  // namespace

TEST_CASE("a failed worker stops the whole group, which restarts and then succeeds") {
  Harness h("", [](FakeProcess& p) {
    p.print("hello\n");
    if (p.attempt() == 0 && is(p, "1"))
      p.end(ExitStatus::exited(3));
    else if (p.attempt() >= 1)
      p.end(ExitStatus::exited(0));
    // worker 0 of attempt 0 runs until it is stopped
  });
  auto r = h.run();
  CHECK(r.status == "succeeded");
  CHECK(r.exit_code == 0);
  CHECK(h.supervisor->attempt() == 1);
  CHECK(h.supervisor->book().restarts() == 1);
  REQUIRE(h.spawner.processes.size() == 4);
  CHECK(h.spawner.processes[0]->signals == std::vector<int>{SIGTERM});
  CHECK(h.spawns_of_attempt(1) == 2);
  CHECK(h.events().find("\"event\":\"restart\"") != std::string::npos);
  std::string log = common::read_file(h.run_dir.log_file({"worker", 1}));
  CHECK(log.find("==== dtrain: attempt 0 of worker:1") != std::string::npos);
  CHECK(log.find("==== dtrain: attempt 1 of worker:1") != std::string::npos);
  CHECK(log.find("hello\n") != std::string::npos);
}

TEST_CASE("a configuration error (exit 2) is never restarted") {
  Harness h("", [](FakeProcess& p) {
    if (is(p, "0")) p.end(ExitStatus::exited(2));
  });
  auto r = h.run();
  CHECK(r.status == "failed");
  CHECK(r.exit_code == 2);
  CHECK(h.spawner.processes.size() == 2);
  REQUIRE(r.failure);
  CHECK(r.failure->outcome == launcher::Outcome::kConfigError);
  CHECK(r.failure->task.text() == "worker:0");
}

TEST_CASE("a preempted group restarts on the preemption budget") {
  Harness h("", [](FakeProcess& p) {
    if (p.attempt() < 2 && is(p, "1"))
      p.end(ExitStatus::exited(143));
    else if (p.attempt() == 2)
      p.end(ExitStatus::exited(0));
  });
  auto r = h.run();
  CHECK(r.status == "succeeded");
  CHECK(h.supervisor->book().preemptions() == 2);
  CHECK(h.supervisor->book().restarts() == 0);
}

TEST_CASE("an exhausted restart budget fails with the first failure's code") {
  Harness h("", [](FakeProcess& p) {
    if (is(p, "1")) p.end(ExitStatus::exited(7));
  });
  auto r = h.run();
  CHECK(r.status == "failed");
  CHECK(r.exit_code == 7);
  CHECK(r.reason.find("restart budget") != std::string::npos);
  CHECK(h.supervisor->attempt() == 2);  // attempts 0, 1, 2 with max_restarts 2
  REQUIRE(r.failure);
  CHECK(r.failure->what == "exit code 7");
  CHECK(r.failure->attempt == 2);
}

TEST_CASE("two failures in a row before any progress are a configuration problem") {
  Harness h(R"(, "hang_timeout_seconds": 100)",
            [](FakeProcess& p) { p.end(ExitStatus::exited(1)); },
            [](auto& r) {
              r.startup_seconds = 60;
              r.max_restarts = 10;
            });
  auto r = h.run();
  CHECK(r.status == "failed");
  CHECK(r.reason.find("configuration problem") != std::string::npos);
  CHECK(h.supervisor->attempt() == 1);
}

TEST_CASE("progress from a heartbeat keeps failures restartable") {
  Harness* self = nullptr;
  Harness h(
      "",
      [&self](FakeProcess& p) {
        if (p.attempt() >= 2) return p.end(ExitStatus::exited(0));
        std::string task = is(p, "0") ? "worker:0" : "worker:1";
        int attempt = p.attempt();
        boost::asio::post(*p.io, [&self, task, attempt, &p] {
          self->supervisor->on_control_message(common::heartbeat_message(task, attempt, 1));
          if (task == "worker:1") p.end(ExitStatus::exited(1));
        });
      },
      [](auto& r) { r.startup_seconds = 60; });
  self = &h;
  auto r = h.run();
  CHECK(r.status == "succeeded");
  CHECK(h.supervisor->book().restarts() == 2);
}

TEST_CASE("a crash is reported with its signal's name") {
  Harness h(
      "",
      [](FakeProcess& p) {
        if (is(p, "0")) p.end(ExitStatus::killed(SIGSEGV));
      },
      [](auto& r) { r.max_restarts = 0; });
  auto r = h.run();
  REQUIRE(r.failure);
  CHECK(r.failure->outcome == launcher::Outcome::kCrashed);
  CHECK(r.failure->what == "killed by SIGSEGV");
  CHECK(r.exit_code == 128 + SIGSEGV);
}

TEST_CASE("a worker without progress for hang_timeout_seconds is failed and the group restarts") {
  Harness h(R"(, "hang_timeout_seconds": 0.3)", [](FakeProcess& p) {
    if (p.attempt() == 0 && is(p, "1")) return;  // silent forever
    p.print("step\n");
    p.end(ExitStatus::exited(0));  // a finished worker is never "hung"
  });
  auto r = h.run();
  CHECK(r.status == "succeeded");
  CHECK(h.events().find("\"event\":\"hang\",\"task\":\"worker:1\"") != std::string::npos);
}

TEST_CASE("a remote worker its agent has not started within startup_seconds is a start failure") {
  const std::string remote = R"(, "cluster": {"worker": ["localhost:1", "192.0.2.1:2"]})";
  const Tweak quick = [](common::RestartPolicy& r) { r.startup_seconds = 0.2; };
  SECTION("ssh never reaches the agent: failure naming the host, the group stopped") {
    Harness h(
        remote,
        [](FakeProcess& p) {
          if (p.request.agent()) return;  // ssh still connecting, forever
          p.print("step\n");
        },
        quick);
    auto r = h.run();
    CHECK(r.status == "failed");
    REQUIRE(r.failure);
    CHECK(r.failure->task.text() == "worker:1");
    CHECK(r.failure->what.find("not started on host 192.0.2.1 within 0.2 s") != std::string::npos);
    CHECK(h.events().find("\"event\":\"start_failure\",\"task\":\"worker:1\"") !=
          std::string::npos);
  }
  SECTION("an agent that reports its worker started is not timed out") {
    Harness h(
        remote,
        [](FakeProcess& p) {
          if (p.request.agent())
            p.print(
                "\x1e"
                "dtrain-agent {\"event\":\"started\",\"pid\":42}\n");
          p.after(0.4, [&p] { p.end(ExitStatus::exited(0)); });  // outlives startup_seconds
        },
        quick);
    auto r = h.run();
    CHECK(r.status == "succeeded");
    CHECK(h.events().find("start_failure") == std::string::npos);
  }
}

TEST_CASE("workers that ignore SIGTERM get SIGKILL after one shared grace period") {
  Harness h(
      "",
      [](FakeProcess& p) {
        p.ignore_sigterm = true;
        if (is(p, "1")) p.end(ExitStatus::exited(5));
      },
      [](auto& r) { r.max_restarts = 0; });
  auto r = h.run();
  CHECK(r.status == "failed");
  CHECK(h.spawner.processes[0]->signals == std::vector<int>{SIGTERM, SIGKILL});
}

TEST_CASE("a signal to the launcher stops the group gracefully: status stopped, exit 143") {
  Harness* self = nullptr;
  Harness h("", [&self](FakeProcess& p) {
    if (is(p, "1")) boost::asio::post(*p.io, [&self] { self->supervisor->stop(SIGTERM); });
  });
  self = &h;
  auto r = h.run();
  CHECK(r.status == "stopped");
  CHECK(r.exit_code == 143);
  CHECK(h.spawner.processes.size() == 2);
  for (const auto& p : h.spawner.processes) CHECK(p->signals == std::vector<int>{SIGTERM});
}

TEST_CASE("a launcher signal during the back-off ends the job without another start") {
  Harness* self = nullptr;
  Harness h(
      "",
      [&self](FakeProcess& p) {
        p.end(ExitStatus::exited(5));
        if (is(p, "1")) {
          // Runs after both exits and the teardown, i.e. while the supervisor waits to restart.
          p.after(0.005, [&self] { self->supervisor->stop(SIGINT); });
        }
      },
      [](auto& r) { r.backoff_seconds = r.backoff_max_seconds = 5; });
  self = &h;
  auto r = h.run(3);
  CHECK(r.status == "stopped");
  CHECK(h.spawner.processes.size() == 2);
}

// Issue 46, item 5: a SIGTERM to the launcher after every training task had exited 0 (here while
// the evaluator is being stopped) was recorded as "stopped", and the next launch trained again.
TEST_CASE("a stop that comes after training finished leaves a succeeded run") {
  Harness* self = nullptr;
  Harness h(R"(, "cluster": {"worker": ["localhost:1"], "evaluator": ["localhost:2"]})",
            [&self](FakeProcess& p) {
              if (p.env("TF_CONFIG").find("\"type\": \"worker\"") != std::string::npos) {
                p.end(ExitStatus::exited(0));
                return;
              }
              p.ignore_sigterm = true;  // the evaluator lingers in its grace period
              p.after(0.02, [&self, &p] {
                self->supervisor->stop(SIGTERM);
                p.end(ExitStatus::killed(SIGTERM));
              });
            });
  self = &h;
  auto r = h.run();
  CHECK(r.status == "succeeded");
  CHECK(r.exit_code == 0);
}

TEST_CASE("an evaluator does not hold up success; it is stopped when training ends") {
  Harness h(R"(, "cluster": {"worker": ["localhost:1"], "evaluator": ["localhost:2"]})",
            [](FakeProcess& p) {
              if (p.env("TF_CONFIG").find("\"type\": \"worker\"") != std::string::npos)
                p.end(ExitStatus::exited(0));
            });
  auto r = h.run();
  CHECK(r.status == "succeeded");
  REQUIRE(h.spawner.processes.size() == 2);
  CHECK(h.spawner.processes[1]->signals == std::vector<int>{SIGTERM});
}

TEST_CASE("with \"success\": \"chief\" the chief's exit 0 ends the job and stops the rest") {
  Harness h(R"(, "success": "chief")", [](FakeProcess& p) {
    if (is(p, "0")) p.end(ExitStatus::exited(0));
  });
  auto r = h.run();
  CHECK(r.status == "succeeded");
  CHECK(h.spawner.processes[1]->signals == std::vector<int>{SIGTERM});
}

TEST_CASE("an exception in a handler stops the group with a summary instead of escaping the loop") {
  // The back-off timer starts attempt 1, whose second spawn throws an error of no known kind.
  Harness h("", [](FakeProcess& p) {
    if (p.attempt() == 0 && is(p, "1")) p.end(ExitStatus::exited(1));
    if (p.attempt() == 1 && is(p, "1")) throw std::logic_error("boom");
  });
  auto r = h.run();
  CHECK(r.status == "failed");
  CHECK(r.exit_code != 0);
  CHECK(r.reason == "launcher: back-off timer handler failed: boom");
  REQUIRE(h.spawner.processes.size() == 4);
  CHECK(h.spawner.processes[2]->signals == std::vector<int>{SIGTERM});  // attempt 1, worker 0
  CHECK(h.spawner.processes[2]->ended);
  CHECK(h.state().find("\"status\":\"failed\"") != std::string::npos);
  CHECK(h.events().find("\"event\":\"launcher_fault\"") != std::string::npos);
}

TEST_CASE("events.jsonl on a full disk stops the group, no restart; state.json is final") {
  Harness h(
      "", [](FakeProcess& p) { p.print("running\n"); }, {},
      [](const common::RunDir& run_dir) {
        std::filesystem::create_symlink("/dev/full", run_dir.events_jsonl());
      });
  auto r = h.run();
  CHECK(r.status == "failed");
  CHECK(r.exit_code == 1);
  CHECK(r.reason.find("launcher: cannot append to " + h.run_dir.events_jsonl() +
                      ": No space left on device") == 0);
  CHECK(h.spawner.processes.size() == 2);
  for (const auto& p : h.spawner.processes) CHECK(p->ended);
  CHECK(h.state().find("\"status\":\"failed\"") != std::string::npos);
}

TEST_CASE("a log the launcher cannot write stops the group, naming the log and the cause") {
  Harness h(
      "", [](FakeProcess& p) { p.print("a line\n"); }, {},
      [](const common::RunDir& run_dir) {
        std::filesystem::create_symlink("/dev/full", run_dir.log_file({"worker", 1}));
      });
  auto r = h.run();
  CHECK(r.status == "failed");
  CHECK(r.reason == "launcher: cannot write " + h.run_dir.log_file({"worker", 1}) +
                        ": No space left on device");
  CHECK(h.spawner.processes.size() == 2);
  CHECK(h.state().find("\"status\":\"failed\"") != std::string::npos);
}

TEST_CASE("the worker that says the disk is full is blamed, not the one that failed first") {
  Harness h(
      "",
      [](FakeProcess& p) {
        if (is(p, "1")) return p.end(ExitStatus::exited(1));  // first, and silent
        p.ignore_sigterm = true;
        p.print("Epoch 1/3\ncannot write backup/ckpt.tmp: No space left on device\n");
        boost::asio::post(*p.io, [&p] { p.end(ExitStatus::exited(1)); });
      },
      [](auto& r) { r.max_restarts = 0; });
  auto r = h.run();
  CHECK(r.status == "failed");
  REQUIRE(r.failure);
  CHECK(r.failure->task.text() == "worker:0");
  CHECK(r.failure->what == "exit code 1");
  CHECK(r.failure->last_lines ==
        std::vector<std::string>{"Epoch 1/3",
                                 "cannot write backup/ckpt.tmp: No space left on device"});
}

// A listening socket on 127.0.0.1: a port in use.
struct BusyPort {
  BusyPort() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t length = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
    port = ntohs(addr.sin_port);
  }
  ~BusyPort() { ::close(fd); }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
};

TEST_CASE("a busy MASTER_PORT the launcher picked is picked again; the job's own is exit 2") {
  BusyPort busy;
  auto succeed = [](FakeProcess& p) { p.end(ExitStatus::exited(0)); };
  Harness picked("", succeed, {}, {}, busy.port);
  CHECK(picked.run().status == "succeeded");
  REQUIRE(picked.spawner.processes.size() == 2);
  for (const auto& p : picked.spawner.processes) {
    CHECK(p->env("MASTER_PORT") != std::to_string(busy.port));
    CHECK(std::stoi(p->env("MASTER_PORT")) > 0);
  }

  Harness chosen(", \"master_port\": " + std::to_string(busy.port), succeed, {}, {}, busy.port);
  auto r = chosen.run();
  CHECK(r.exit_code == 2);
  CHECK(chosen.spawner.processes.empty());
  CHECK_THAT(chosen.state(), Catch::Contains("MASTER_PORT") && Catch::Contains("master_port"));
}

TEST_CASE("a remote task that is never started twice in a row stops the job") {
  const std::string remote = R"(, "cluster": {"worker": ["localhost:1", "192.0.2.1:2"]})";
  SECTION("the start times out: not counted as progress even after startup_seconds") {
    Harness h(
        remote,
        [](FakeProcess& p) {
          if (!p.request.agent()) p.print("step\n");  // the local worker runs on
        },
        [](common::RestartPolicy& r) {
          r.startup_seconds = 0.2;
          r.max_restarts = 5;
        });
    auto r = h.run();
    CHECK(r.status == "failed");
    CHECK(h.supervisor->attempt() == 1);  // two attempts, not the whole budget
    CHECK_THAT(r.reason, Catch::Contains("configuration problem"));
  }
  SECTION("ssh fails at once: its own words reach the failure") {
    Harness h(
        remote,
        [](FakeProcess& p) {
          if (!p.request.agent()) return;
          p.print("ssh: connect to host 192.0.2.1 port 22: Connection refused\r\n");
          p.end(ExitStatus::exited(255));
        },
        [](common::RestartPolicy& r) { r.max_restarts = 5; });
    auto r = h.run();
    CHECK(r.status == "failed");
    CHECK(h.supervisor->attempt() == 1);
    REQUIRE(r.failure);
    CHECK(r.failure->task.text() == "worker:1");
    CHECK_THAT(r.failure->what,
               Catch::Contains("host 192.0.2.1") && Catch::Contains("Connection refused"));
    CHECK(h.events().find("\"event\":\"start_failure\"") != std::string::npos);
  }
}

TEST_CASE("a remote worker's end is the status its agent reported, not the remote shell's") {
  const std::string remote = R"(, "cluster": {"worker": ["localhost:1", "192.0.2.1:2"]})";
  Harness h(
      remote,
      [](FakeProcess& p) {
        if (!p.request.agent()) return;
        p.print(
            "\x1e"
            "dtrain-agent {\"event\":\"started\",\"pid\":42}\n");
        p.print(
            "\x1e"
            "dtrain-agent {\"event\":\"exit\",\"signal\":11}\n");
        p.end(ExitStatus::exited(139));
      },
      [](common::RestartPolicy& r) { r.max_restarts = 0; });
  auto r = h.run();
  REQUIRE(r.failure);
  CHECK(r.failure->outcome == launcher::Outcome::kCrashed);
  CHECK(r.failure->what == "killed by SIGSEGV");
  CHECK(h.events().find("\"event\":\"remote_start\",\"task\":\"worker:1\"") != std::string::npos);
}

TEST_CASE("a recovery says how many steps it redid: summary result and events") {
  const std::string remote = R"(, "cluster": {"worker": ["localhost:1", "192.0.2.1:2"]})";
  auto control = [](const std::string& json) {
    return std::string("\x1e") + "dtrain-control " + json + "\n";
  };
  Harness h(remote, [&](FakeProcess& p) {
    if (!p.request.agent()) {
      if (p.attempt() == 1) p.end(ExitStatus::exited(0));
      return;  // the local worker of attempt 0 runs until stopped
    }
    p.print(
        "\x1e"
        "dtrain-agent {\"event\":\"started\",\"pid\":42}\n");
    int attempt = p.attempt();
    std::string head =
        R"({"type":"progress","task":"worker:1","attempt":)" + std::to_string(attempt);
    if (attempt == 0) {
      p.print(control(head + R"(,"restored_step":0})"));
      p.print(control(head + R"(,"epoch":1,"epochs":2,"step":30,"steps":50,"global_step":30})"));
      p.print(
          "\x1e"
          "dtrain-agent {\"event\":\"exit\",\"code\":1}\n");
      p.end(ExitStatus::exited(1));
    } else {
      p.print(control(head + R"(,"restored_step":20})"));
      p.print(
          "\x1e"
          "dtrain-agent {\"event\":\"exit\",\"code\":0}\n");
      p.end(ExitStatus::exited(0));
    }
  });
  auto r = h.run();
  CHECK(r.status == "succeeded");
  INFO(r.reason);
  REQUIRE(r.recoveries.size() == 1);
  CHECK(r.recoveries[0].reached_step == 30);
  CHECK(r.recoveries[0].restored_step == 20);
  CHECK(r.recoveries[0].steps_redone() == 10);
  CHECK(h.events().find("\"event\":\"recovered\",\"attempt\":1,\"path\":\"restart\","
                        "\"restored_step\":20,"
                        "\"steps_redone\":10") != std::string::npos);
  CHECK(h.state().find("\"steps_redone\":10") != std::string::npos);
}

TEST_CASE("the watchdog leaves a silent evaluator alone and names the worker silent longest") {
  SECTION("an evaluator sends nothing: the job still succeeds") {
    Harness h(R"(, "hang_timeout_seconds": 0.2,
                  "cluster": {"worker": ["localhost:1"], "evaluator": ["localhost:2"]})",
              [](FakeProcess& p) {
                if (p.env("TF_CONFIG").find("\"type\": \"worker\"") == std::string::npos) return;
                // The worker prints (a command job's sign of life) for 0.6 s, three time-outs
                // of the evaluator's silence, then finishes.
                auto left = std::make_shared<int>(12);
                auto step = std::make_shared<std::function<void()>>();
                *step = [&p, left, weak = std::weak_ptr<std::function<void()>>(step)] {
                  p.print("step\n");
                  if (--*left == 0) return p.end(ExitStatus::exited(0));
                  p.after(0.05, [next = weak.lock()] { (*next)(); });
                };
                (*step)();
              });
    auto r = h.run();
    CHECK(r.status == "succeeded");
    CHECK(h.events().find("\"event\":\"hang\"") == std::string::npos);
  }
  SECTION("worker 1 stops first; worker 0 waits for it and falls silent later: worker 1 hung") {
    Harness* self = nullptr;
    Harness h(
        R"(, "hang_timeout_seconds": 0.5, "cluster": {"worker": ["localhost:1", "localhost:2"]})",
        [&self](FakeProcess& p) {
          if (p.attempt() > 0) return p.end(ExitStatus::exited(0));
          if (is(p, "1")) return;  // frozen from the start
          // worker 0 reports for another 0.2 s, then waits in the all-reduce
          p.after(0.2, [&self] {
            self->supervisor->on_control_message(common::heartbeat_message("worker:0", 0, 1));
          });
        },
        [](auto& r) { r.max_restarts = 1; });
    self = &h;
    auto r = h.run();
    CHECK(r.status == "succeeded");
    CHECK(h.events().find("\"event\":\"hang\",\"task\":\"worker:1\"") != std::string::npos);
  }
}

TEST_CASE("a lost host is retried with back-off within the budget, not taken for a bad config") {
  const std::string remote = R"(, "cluster": {"worker": ["localhost:1", "192.0.2.1:2"]})";
  auto agent = [](const std::string& json) {
    return "\x1e"
           "dtrain-agent " +
           json + "\n";
  };
  Harness h(
      remote,
      [&](FakeProcess& p) {
        int attempt = p.attempt();
        if (!p.request.agent()) {
          if (attempt == 3) p.end(ExitStatus::exited(0));
          return;  // runs until stopped
        }
        if (attempt == 0) {  // trains, then the link is cut: the session ends unreported
          p.print(agent(R"({"event":"started","pid":42})"));
          return p.end(ExitStatus::exited(255));
        }
        if (attempt < 3) {  // still cut: ssh cannot reach the host
          p.print("ssh: connect to host 192.0.2.1 port 22: No route to host\r\n");
          return p.end(ExitStatus::exited(255));
        }
        p.print(agent(R"({"event":"started","pid":43})"));  // the link is back
        p.print(agent(R"({"event":"exit","code":0})"));
        p.end(ExitStatus::exited(0));
      },
      [](common::RestartPolicy& r) { r.max_restarts = 5; });
  auto r = h.run();
  CHECK(r.status == "succeeded");
  CHECK(h.supervisor->attempt() == 3);
  CHECK(h.events().find("\"event\":\"lost_host\"") != std::string::npos);
  CHECK(h.events().find("was lost earlier and is still unreachable") != std::string::npos);

  SECTION("while it stays unreachable the budget, not the silent-failure rule, ends the job") {
    Harness lost(
        remote,
        [&](FakeProcess& p) {
          if (!p.request.agent()) return;
          if (p.attempt() == 0) p.print(agent(R"({"event":"started","pid":42})"));
          p.end(ExitStatus::exited(255));
        },
        [](common::RestartPolicy& policy) { policy.max_restarts = 3; });
    auto failed = lost.run();
    CHECK(failed.status == "failed");
    CHECK_THAT(failed.reason, Catch::Contains("restart budget"));
    REQUIRE(failed.failure);
    CHECK_THAT(failed.failure->what, Catch::Contains("host 192.0.2.1 was lost earlier"));
  }
}

TEST_CASE("a \"workers\": N port taken by another program is picked again; TF_CONFIG follows") {
  auto succeed = [](FakeProcess& p) { p.end(ExitStatus::exited(0)); };
  Harness h("", succeed);
  std::string planned = h.supervisor->snapshot().tasks.at(1).address;  // localhost:PORT
  int port = std::stoi(planned.substr(planned.rfind(':') + 1));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  auto r = h.run();
  ::close(fd);
  CHECK(r.status == "succeeded");
  REQUIRE(h.spawner.processes.size() == 2);
  for (const auto& p : h.spawner.processes) {
    std::string tf_config = p->env("TF_CONFIG");
    CHECK(tf_config.find(planned) == std::string::npos);  // every task sees the new port
  }
  std::string now = h.supervisor->snapshot().tasks.at(1).address;
  CHECK(now != planned);
  CHECK(h.spawner.processes[0]->env("TF_CONFIG").find(now) != std::string::npos);
  CHECK(h.events().find("\"event\":\"port\",\"task\":\"worker:1\",\"taken\":" +
                        std::to_string(port)) != std::string::npos);
}
