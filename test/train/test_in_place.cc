// End to end through `dtrain launch` with three real dtrain-workers (docs/design.md#in-place-
// recovery): worker 1 is SIGKILLed in the middle of an epoch, with epoch checkpoints only. The
// launcher replaces it in place: workers 0 and 2 are the same processes at the end, the group
// re-formed as generation 1 and redid at most one step, and the final model is the undisturbed
// run's, bit for bit. The same job with "recovery": "restart" takes the old path: every worker
// restarts from the last epoch checkpoint.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

// 3 epochs of 150 steps; rank 0 sleeps 4 ms a step (the others wait for it), so an epoch takes
// about a second and the kill lands inside epoch 2.
constexpr int kStepsPerEpoch = 150;
const char* kJob = R"({"job": "in-place", "workers": 3, RECOVERY
 "restart": {"max_restarts": 3, "backoff_seconds": 0.1, "grace_seconds": 10},
 "env": {"DTRAIN_TEST_SLOW_STEP_MS": "0:4"},
 "train": {"model": {"input_shape": [8, 8, 1], "layers": [
   {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"}, {"type": "flatten"},
   {"type": "dropout", "rate": 0.1}, {"type": "dense", "units": 32, "activation": "relu"},
   {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "adam", "learning_rate": 0.003},
  "data": {"source": "synthetic", "examples": 4096, "classes": 4},
  "per_worker_batch_size": 8, "epochs": 3, "steps_per_epoch": 150, "seed": 11,
  "validation": true, "tensorboard": false,
  "backup": {"save_freq": "epoch", "keep": 2, "delete_on_success": false}}})";

std::string job_text(const std::string& recovery) {
  std::string text = kJob;
  text.replace(text.find("RECOVERY"), 8,
               recovery.empty() ? "" : "\"recovery\": \"" + recovery + "\",");
  return text;
}

common::JsonDocument read_json(const std::string& path) {
  return common::JsonDocument::parse(common::read_file(path), path);
}

// The training tasks' pids in state.json, by task id.
std::map<std::string, int> pids(const std::string& dir) {
  std::map<std::string, int> out;
  common::JsonDocument state = read_json(dir + "/state.json");
  for (const common::JsonNode& w : state.root().at("workers").as_array())
    out[w.at("task").as_string()] = static_cast<int>(w.at("pid").as_int(0, 1 << 30));
  return out;
}

// Worker 1's last reported global step (-1 before it reports one).
int64_t reported_step(const std::string& dir) {
  if (!fs::exists(dir + "/state.json")) return -1;
  try {
    common::JsonDocument state = read_json(dir + "/state.json");
    const common::JsonNode w = state.root().at("workers").as_array()[1];
    std::optional<common::JsonNode> p = w.find("last_progress");
    if (!p) return -1;
    std::optional<common::JsonNode> step = p->find("global_step");
    return step ? step->as_int(0, 1 << 30) : -1;
  } catch (const common::ConfigError&) {
    return -1;  // replaced between reads
  }
}

// Launches the job in dir and, when kill is set, SIGKILLs worker 1 once it reports a step inside
// epoch 2; returns the launcher's result and the pids seen just before the kill.
struct Launched {
  testing::ProcessResult result;
  std::map<std::string, int> before_kill;
  int64_t killed_after_step = -1;
};

Launched launch(const std::string& job, const std::string& dir, bool kill) {
  testing::BackgroundProcess launcher({testing::binary("dtrain"), "launch", job, "--run-dir", dir});
  Launched out;
  if (kill) {
    for (int i = 0; i < 6000 && reported_step(dir) < kStepsPerEpoch + 10; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    out.killed_after_step = reported_step(dir);
    out.before_kill = pids(dir);
    ::kill(out.before_kill.at("worker:1"), SIGKILL);
  }
  out.result = launcher.wait(300);
  return out;
}

std::vector<common::JsonDocument> events(const std::string& dir, const std::string& kind) {
  std::vector<common::JsonDocument> out;
  std::ifstream in(dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    common::JsonDocument e = common::JsonDocument::parse(line, "events.jsonl");
    if (e.root().at("event").as_string() == kind) out.push_back(std::move(e));
  }
  return out;
}

size_t lines_of(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

}  // namespace

TEST_CASE("a SIGKILLed worker is replaced in place: survivors kept, one step at most redone") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << job_text("");

  std::string calm = base.path() + "/calm";
  Launched reference = launch(job, calm, false);
  INFO(reference.result.err);
  REQUIRE(reference.result.exit_code == 0);
  std::string expected = common::read_file(calm + "/model/model.safetensors");

  std::string dir = base.path() + "/killed";
  Launched run = launch(job, dir, true);
  INFO(run.result.out << run.result.err);
  REQUIRE(run.result.exit_code == 0);
  INFO("killed after step " << run.killed_after_step);
  CHECK(run.killed_after_step > kStepsPerEpoch);
  CHECK(run.killed_after_step < 2 * kStepsPerEpoch);

  // The survivors are the same processes; worker 1 is a new one.
  std::map<std::string, int> after = pids(dir);
  CHECK(after.at("worker:0") == run.before_kill.at("worker:0"));
  CHECK(after.at("worker:2") == run.before_kill.at("worker:2"));
  CHECK(after.at("worker:1") != run.before_kill.at("worker:1"));

  std::vector<common::JsonDocument> in_place = events(dir, "in_place");
  REQUIRE(in_place.size() == 1);
  CHECK(in_place[0].root().at("task").as_string() == "worker:1");
  CHECK(in_place[0].root().at("generation").as_int(0, 100) == 1);
  CHECK(events(dir, "teardown").size() == 1);  // only the one at the end
  std::vector<common::JsonDocument> recovered = events(dir, "recovered");
  REQUIRE(recovered.size() == 1);
  const common::JsonNode r = recovered[0].root();
  CHECK(r.at("path").as_string() == "in_place");
  CHECK(r.at("generation").as_int(0, 100) == 1);
  CHECK(r.at("steps_redone").as_int(0, 1 << 30) <= 1);
  CHECK(r.at("restored_step").as_int(0, 1 << 30) >= run.killed_after_step);
  CHECK(r.at("seconds").as_number(0, 1e9) < 60);

  CHECK(common::read_file(dir + "/model/model.safetensors") == expected);
  CHECK(lines_of(dir + "/metrics.jsonl") == 3);  // one line per epoch, none twice
  std::string log0 = common::read_file(dir + "/logs/worker-0.log");
  CHECK(log0.find("re-formed as generation 1") != std::string::npos);
  CHECK(log0.find("==== dtrain: attempt 1") == std::string::npos);  // never restarted
}

TEST_CASE("\"recovery\": \"restart\" restarts the whole group from the epoch checkpoint") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << job_text("restart");
  std::string dir = base.path() + "/killed";
  Launched run = launch(job, dir, true);
  INFO(run.result.out << run.result.err);
  REQUIRE(run.result.exit_code == 0);
  std::map<std::string, int> after = pids(dir);
  CHECK(after.at("worker:0") != run.before_kill.at("worker:0"));
  CHECK(after.at("worker:2") != run.before_kill.at("worker:2"));
  CHECK(events(dir, "in_place").empty());
  std::vector<common::JsonDocument> recovered = events(dir, "recovered");
  REQUIRE(recovered.size() == 1);
  CHECK(recovered[0].root().at("path").as_string() == "restart");
  CHECK(recovered[0].root().at("restored_step").as_int(0, 1 << 30) == kStepsPerEpoch);
  CHECK(recovered[0].root().at("steps_redone").as_int(0, 1 << 30) >= 10);
}
