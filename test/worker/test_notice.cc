// The launcher's notice at a real dtrain-worker (docs/design.md#in-place-recovery): SIGUSR1,
// queued with the new generation as its value. A worker training undisturbed survives a plain
// SIGUSR1 and notices it need not act on; a worker whose peer is frozen (SIGSTOP: it closes
// nothing, like a peer cut off by the network) leaves its collective at once on a notice for the
// next generation instead of waiting out the link's time-out (600 s). A worker finishing under a
// stream of SIGUSR1 (the launcher notices every member when another fails) still exits 0: the
// signal thread outlives main() and must stay harmless through static destruction. The tests
// wait for what the worker writes (its log, its progress record) and assert order and outcome;
// their time-outs are guards against a hang only.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "common/cluster_spec.h"
#include "common/ports.h"
#include "common/progress_record.h"
#include "common/tf_config.h"
#include "test/support/processes.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

namespace {

// A guard against a hang, not a time limit: far above the seconds anything here takes.
constexpr double kGuardSeconds = 60;

// tiny-synthetic, longer: 3 epochs of 100 steps, rank 0 sleeping 10 ms a step (the others wait
// for it), so training lasts a few seconds; communication as asked.
std::string job_file(const testing::TempDir& dir, const std::string& communication) {
  std::string text =
      common::read_file(std::string(DTRAIN_SOURCE_DIR) + "/configs/tiny-synthetic.json");
  auto replace = [&](const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  };
  replace("\"epochs\": 2", "\"epochs\": 3");
  replace("\"steps_per_epoch\": 8", "\"steps_per_epoch\": 100");
  replace("\"save_freq\": 4", "\"save_freq\": \"epoch\"");
  replace("\"communication\": \"ring\"", "\"communication\": \"" + communication + "\"");
  std::string path = dir.path() + "/job-" + communication + ".json";
  common::write_file_atomically(path, text);
  return path;
}

testing::ProcessOptions worker_env(const testing::TempDir& dir, const std::string& progress) {
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  options.env["TF_CONFIG"] = std::nullopt;
  options.env["DTRAIN_CONTROL"] = std::nullopt;
  options.env["DTRAIN_RECOVERY"] = std::nullopt;
  options.env["DTRAIN_TEST_SLOW_STEP_MS"] = "0:10";
  options.env["DTRAIN_PROGRESS_FILE"] = dir.path() + "/" + progress;
  return options;
}

// The global step in a worker's progress record; -1 before it has one.
int64_t global_step(const std::string& record) {
  std::optional<common::ProgressSample> sample = common::read_progress_record(record);
  return sample ? static_cast<int64_t>(sample->global_step) : -1;
}

// Waits (up to a minute) until the record says the worker has finished `steps` steps.
bool reached_step(const std::string& record, int64_t steps) {
  for (int i = 0; i < 6000; ++i) {
    if (global_step(record) >= steps) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The state letter of pid in /proc/<pid>/stat (R, S, T, Z, ...); '?' when it cannot be read.
char process_state(int pid) {
  std::string stat = testing::read_all("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

// Waits until the worker's log (stderr so far) holds text; false after the guard.
bool logged(const testing::BackgroundProcess& worker, const std::string& text) {
  return testing::wait_for([&] { return worker.err_so_far().find(text) != std::string::npos; },
                           kGuardSeconds);
}

void queue_sigusr1(int pid, int generation) {
  sigval value{};
  value.sival_int = generation;
  REQUIRE(::sigqueue(pid, SIGUSR1, value) == 0);
}

// Fires SIGUSR1 at pid, plain (kill) and queued with generation 0 (sigqueue) in turn, every
// 20 us, until the process has ended or a minute has passed. It stops at the zombie, which the
// test has not reaped yet, so the pid cannot be reused meanwhile. Returns how many were sent.
int flood_sigusr1(int pid) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  int sent = 0;
  for (int i = 0; testing::process_alive(pid) && Clock::now() < deadline; ++i) {
    sigval value{};
    int rc = i % 2 == 0 ? ::kill(pid, SIGUSR1) : ::sigqueue(pid, SIGUSR1, value);
    if (rc == 0) ++sent;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return sent;
}

}  // namespace

TEST_CASE("a finishing worker survives SIGUSR1 at every point of its end, in place or not") {
  // Before issue 43's item 19 was fixed, the signal thread logged through a logger that static
  // destruction had freed, and every one of these runs (or nearly) died by SIGSEGV.
  const bool in_place = GENERATE(false, true);
  INFO((in_place ? "in place" : "not in place"));
  testing::TempDir dir;
  for (int run = 0; run < 5; ++run) {
    INFO("run " << run);
    testing::ProcessOptions options = worker_env(dir, "progress-" + std::to_string(run));
    if (in_place) options.env["DTRAIN_RECOVERY"] = "in_place";
    const std::string record = options.env["DTRAIN_PROGRESS_FILE"].value();
    testing::BackgroundProcess worker(
        {testing::binary("dtrain-worker"), "--config",
         std::string(DTRAIN_SOURCE_DIR) + "/configs/tiny-synthetic.json", "--run-dir",
         dir.path() + "/run-" + std::to_string(run)},
        options);
    // The record exists once the worker trains, long after its signal thread has started.
    REQUIRE(reached_step(record, 1));
    const int sent = flood_sigusr1(worker.pid());
    testing::ProcessResult r = worker.wait(60);
    INFO(r.err.substr(r.err.size() > 2000 ? r.err.size() - 2000 : 0));
    CHECK(sent > 0);
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.err, Catch::Contains("finished"));
  }
}

TEST_CASE("a worker training undisturbed survives SIGUSR1, plain or queued, and finishes") {
  const bool in_place = GENERATE(true, false);
  INFO((in_place ? "in place" : "not in place"));
  testing::TempDir dir;
  testing::ProcessOptions options = worker_env(dir, "progress");
  if (in_place) options.env["DTRAIN_RECOVERY"] = "in_place";
  testing::BackgroundProcess worker({testing::binary("dtrain-worker"), "--config",
                                     job_file(dir, "ring"), "--run-dir", dir.path() + "/run"},
                                    options);
  REQUIRE(reached_step(options.env["DTRAIN_PROGRESS_FILE"].value(), 5));
  // Standard signals do not queue: one sent while another SIGUSR1 is pending is lost, so each
  // waits until the worker's signal thread has logged the one before.
  const std::string plain = "without a generation: ignored";
  // In place or not, a world of one that is not elastic takes no notice: it could not re-form
  // (an elastic group shrunk to one does: test_interrupt, the test bed of docs/multi-host.md).
  const std::string zero = "notice for generation 0 ignored: no group here to leave";
  const std::string one = "notice for generation 1 ignored: no group here to leave";
  worker.signal(SIGUSR1);  // plain: no generation
  CHECK(logged(worker, plain));
  queue_sigusr1(worker.pid(), 0);  // the generation it is in: nothing to leave
  CHECK(logged(worker, zero));
  queue_sigusr1(worker.pid(), 1);  // a world of one that is not elastic has no group to re-form
  CHECK(logged(worker, one));
  // Taken while it trained: its 300 steps were not all done yet.
  CHECK(global_step(options.env["DTRAIN_PROGRESS_FILE"].value()) < 300);
  testing::ProcessResult r = worker.wait(120);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  // Each once, in the order sent, and all before the worker finished.
  for (const std::string* text : {&plain, &zero, &one}) {
    CAPTURE(*text);
    CHECK(r.err.find(*text) == r.err.rfind(*text));
  }
  CHECK(r.err.find(plain) < r.err.find(zero));
  CHECK(r.err.find(zero) < r.err.find(one));
  CHECK(r.err.find(one) < r.err.rfind("finished"));
}

TEST_CASE("a notice makes a worker leave a collective its frozen peer never joins") {
  const std::string communication = GENERATE(as<std::string>{}, "ring", "shm");
  INFO(communication);
  testing::TempDir dir;
  std::string job = job_file(dir, communication);
  std::vector<std::string> addresses;
  for (int port : common::pick_free_ports(2))
    addresses.push_back("127.0.0.1:" + std::to_string(port));
  common::ClusterSpec cluster({{"worker", addresses}});
  std::vector<std::unique_ptr<testing::BackgroundProcess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    testing::ProcessOptions options = worker_env(dir, "progress-" + std::to_string(rank));
    options.env["TF_CONFIG"] = common::format_tf_config(cluster, {"worker", rank});
    options.env["DTRAIN_TOKEN"] = "0123abcd";
    options.env["DTRAIN_JOB"] = "notice";
    options.env["DTRAIN_RECOVERY"] = "in_place";
    workers.push_back(std::make_unique<testing::BackgroundProcess>(
        std::vector<std::string>{testing::binary("dtrain-worker"), "--config", job, "--run-dir",
                                 dir.path() + "/run"},
        options));
  }
  REQUIRE(reached_step(dir.path() + "/progress-1", 5));
  workers[1]->signal(SIGSTOP);  // frozen: its sockets and shared memory stay open
  // Worker 0 waits for it now: worker 1 is stopped, and worker 0 is inside a collective that
  // worker 1 has not ended (and cannot, stopped).
  const auto waits_for_frozen_peer = [&] {
    auto zero = common::read_progress_record(dir.path() + "/progress-0");
    auto one = common::read_progress_record(dir.path() + "/progress-1");
    return process_state(workers[1]->pid()) == 'T' && zero && one && zero->in_collective() &&
           zero->begun > one->ended;
  };
  REQUIRE(testing::wait_for(waits_for_frozen_peer, kGuardSeconds));
  queue_sigusr1(workers[0]->pid(), 1);
  // The guard is far below the link's time-out (600 s): only the notice can end the wait in it.
  testing::ProcessResult r = workers[0]->wait(kGuardSeconds);
  workers[1]->signal(SIGKILL);
  workers[1]->wait(10);
  INFO(r.err);
  CHECK_FALSE(r.timed_out);
  CHECK_THAT(r.err, Catch::Contains("notice: the launcher re-forms the group as generation 1"));
  // Nobody answers its reform request here, so it ends; under a launcher it joins generation 1.
  CHECK_THAT(r.err, Catch::Contains("the group broke"));
  CHECK_THAT(r.err, Catch::Contains("the launcher re-forms the group as generation 1)"));
  CHECK(r.exit_code != 0);
}
