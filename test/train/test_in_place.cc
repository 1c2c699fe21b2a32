// End to end through `dtrain launch` with three real dtrain-workers
// (docs/design.md#in-place-recovery): worker 1 is SIGKILLed in the middle of an epoch, with epoch
// checkpoints only. The launcher replaces it in place: workers 0 and 2 are the same processes at
// the end, the group re-formed as generation 1 and redid at most one step, and the final model is
// the undisturbed run's, bit for bit (with a spare too, which ran a warm-up step before its
// promotion, and with a dynamic loss scale, whose power-of-two scale changes no bit). The same job
// with "recovery": "restart" takes the old path: every worker restarts from the last epoch
// checkpoint.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <thread>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/progress_record.h"
#include "test/support/language_model_job.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "worker/train/safetensors.h"

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

// loss_scale: Keras's dynamic loss scale (docs/design.md#loss-scaling) in fp32; its scale is a
// power of two, so the weights are the unscaled run's, bit for bit.
// residual: a residual network with batch normalization instead of kJob's model (its moving
// statistics are state that a survivor must send, and a spare's warm-up must put back; bn1 is
// synchronized, its statistics summed over the group inside the step).
std::string job_text(const std::string& recovery, int spares = 0, bool loss_scale = false,
                     bool residual = false) {
  std::string text = kJob;
  if (residual) {
    size_t begin = text.find("\"model\":"), end = text.find("\"loss\":");
    text.replace(begin, end - begin, R"("model": {"input_shape": [8, 8, 1], "layers": [
   {"name": "stem", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
   {"name": "bn0", "type": "batch_normalization"}, {"name": "r0", "type": "relu"},
   {"name": "c1", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
   {"name": "bn1", "type": "batch_normalization", "momentum": 0.9, "synchronized": true},
   {"name": "sum", "type": "add", "inputs": ["r0", "bn1"]}, {"type": "relu"},
   {"type": "flatten"}, {"type": "dropout", "rate": 0.1}, {"type": "dense", "units": 4}]},
  )");
  }
  std::string keys = recovery.empty() ? "" : "\"recovery\": \"" + recovery + "\",";
  if (spares > 0) keys += "\"spares\": " + std::to_string(spares) + ",";
  text.replace(text.find("RECOVERY"), 8, keys);
  if (loss_scale)
    text.replace(text.find("\"seed\": 11,"), 11, "\"seed\": 11, \"loss_scale\": \"dynamic\",");
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

// Worker 1's global step as its progress record says it (docs/design.md#frozen-workers): written
// after every step, so the kill lands where the test means it to however busy the machine is (a
// progress line comes only every half second). -1 before it has one.
int64_t worker_1_step(const std::string& dir) {
  std::optional<common::ProgressSample> record =
      common::read_progress_record(dir + "/progress/worker-1");
  return record ? static_cast<int64_t>(record->global_step) : -1;
}

// Launches the job in dir and, when kill is set, SIGKILLs worker 1 once it reports a step inside
// epoch 2 (and, with a spare, once the spare is warm and waiting); returns the launcher's result
// and the pids seen just before the kill.
struct Launched {
  testing::ProcessResult result;
  std::map<std::string, int> before_kill;
  int64_t killed_after_step = -1;
};

Launched launch(const std::string& job, const std::string& dir, bool kill, bool spare = false) {
  testing::BackgroundProcess launcher({testing::binary("dtrain"), "launch", job, "--run-dir", dir});
  Launched out;
  if (kill) {
    auto spare_waits = [&] {
      std::ifstream in(dir + "/logs/spare-0.log");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return text.find("waiting to be promoted") != std::string::npos;
    };
    for (int i = 0; i < 60000 && spare && !spare_waits(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < 60000 && worker_1_step(dir) < kStepsPerEpoch + 10; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    out.killed_after_step = worker_1_step(dir);
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
  std::string calm_job = base.path() + "/calm.json";
  std::ofstream(calm_job) << job_text("");
  std::string calm = base.path() + "/calm";
  Launched reference = launch(calm_job, calm, false);
  INFO(reference.result.err);
  REQUIRE(reference.result.exit_code == 0);
  std::string expected = common::read_file(calm + "/model/model.safetensors");

  // Without a spare a new process is started; with one, the spare takes worker 1's place. With a
  // dynamic loss scale its state travels with the re-formed group's, and the host's count of
  // the optimizer's steps, which it learns from the device a step late, is broadcast settled.
  auto [spares, loss_scale] = GENERATE(table<int, bool>({{0, false}, {1, false}, {0, true}}));
  INFO(spares << " spare(s)" << (loss_scale ? ", dynamic loss scale" : ""));
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << job_text("", spares, loss_scale);
  std::string dir =
      base.path() + "/killed-" + std::to_string(spares) + (loss_scale ? "-scaled" : "");
  Launched run = launch(job, dir, true, spares > 0);
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
  std::vector<common::JsonDocument> promoted = events(dir, "promoted");
  if (spares == 0) {
    CHECK(promoted.empty());
  } else {  // the spare's process became worker 1, and a new spare started
    REQUIRE(promoted.size() == 1);
    CHECK(promoted[0].root().at("task").as_string() == "worker:1");
    CHECK(after.at("worker:1") == run.before_kill.at("spare:0"));
    CHECK(after.at("spare:0") != run.before_kill.at("spare:0"));
    // It was warm before its promotion (docs/design.md#spares): its model built and one step run,
    // which the model, still the undisturbed run's (below), does not show.
    std::string spare_log = common::read_file(dir + "/logs/spare-0.log");
    size_t began = spare_log.find("(pid " + std::to_string(run.before_kill.at("spare:0")) + ")");
    REQUIRE(began != std::string::npos);
    size_t warm = spare_log.find("spare spare:0: warm: ", began);
    CHECK(warm < spare_log.find("==== dtrain:", began));
  }

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
  // The survivors had at least the step before the one worker 1 had finished.
  CHECK(r.at("restored_step").as_int(0, 1 << 30) >= run.killed_after_step - 1);
  CHECK(r.at("seconds").as_number(0, 1e9) < 60);

  CHECK(common::read_file(dir + "/model/model.safetensors") == expected);
  CHECK(lines_of(dir + "/metrics.jsonl") == 3);  // one line per epoch, none twice
  std::string log0 = common::read_file(dir + "/logs/worker-0.log");
  CHECK(log0.find("re-formed as generation 1") != std::string::npos);
  CHECK(log0.find("==== dtrain: attempt 1") == std::string::npos);  // never restarted
  CHECK((log0.find("loss scaling: dynamic") != std::string::npos) == loss_scale);
}

TEST_CASE("a residual network with batch normalization replaced in place ends with its bits") {
  testing::TempDir base;
  std::string calm_job = base.path() + "/calm.json", calm = base.path() + "/calm";
  std::ofstream(calm_job) << job_text("", 0, false, true);
  Launched reference = launch(calm_job, calm, false);
  INFO(reference.result.err);
  REQUIRE(reference.result.exit_code == 0);
  std::string expected = common::read_file(calm + "/model/model.safetensors");
  REQUIRE(expected.find("bn1.moving_variance") != std::string::npos);

  // A spare takes worker 1's place: its warm-up step moved its moving statistics, which it put
  // back, and a survivor sends it the group's.
  std::string job = base.path() + "/job.json", dir = base.path() + "/killed";
  std::ofstream(job) << job_text("", 1, false, true);
  Launched run = launch(job, dir, true, true);
  INFO(run.result.out << run.result.err);
  REQUIRE(run.result.exit_code == 0);
  CHECK(events(dir, "promoted").size() == 1);
  std::vector<common::JsonDocument> recovered = events(dir, "recovered");
  REQUIRE(recovered.size() == 1);
  CHECK(recovered[0].root().at("path").as_string() == "in_place");
  CHECK(common::read_file(dir + "/model/model.safetensors") == expected);
  // Validation is sharded over the workers, each with its own moving statistics: the new
  // worker 1's must be the group's for the figures to be the undisturbed run's.
  auto figures = [](const std::string& run_dir) {
    std::string out;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      common::JsonDocument d = common::JsonDocument::parse(line, "metrics.jsonl");
      for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy"})
        out += d.root().at(key).dump() + " ";
      out += "\n";
    }
    return out;
  };
  CHECK(figures(dir) == figures(calm));
  CHECK(lines_of(dir + "/metrics.jsonl") == 3);
}

TEST_CASE("a character GPT replaced in place ends with its bits") {
  testing::TempDir base;
  std::string calm_job = base.path() + "/calm.json", calm = base.path() + "/calm";
  std::ofstream(calm_job) << testing::with_language_model(job_text(""));
  Launched reference = launch(calm_job, calm, false);
  INFO(reference.result.err);
  REQUIRE(reference.result.exit_code == 0);
  std::string expected = common::read_file(calm + "/model/model.safetensors");
  REQUIRE(expected.find("attention.query.kernel") != std::string::npos);

  std::string job = base.path() + "/job.json", dir = base.path() + "/killed";
  std::ofstream(job) << testing::with_language_model(job_text(""));
  Launched run = launch(job, dir, true);
  INFO(run.result.out << run.result.err);
  REQUIRE(run.result.exit_code == 0);
  std::vector<common::JsonDocument> recovered = events(dir, "recovered");
  REQUIRE(recovered.size() == 1);
  CHECK(recovered[0].root().at("path").as_string() == "in_place");
  CHECK(common::read_file(dir + "/model/model.safetensors") == expected);
  CHECK(lines_of(dir + "/metrics.jsonl") == 3);
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
  CHECK(events(dir, "restart").size() == 1);  // the whole group started again
}

// docs/design.md#frozen-workers: worker 1 SIGSTOPped and never continued. No job setting: the
// launcher sees the group stall (no progress record changes), names worker 1 as stopped, SIGKILLs
// it, and replaces it in place; the final model is still the undisturbed run's.
TEST_CASE("a SIGSTOPped worker is found frozen, named, killed and replaced in place") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << job_text("");
  std::string calm = base.path() + "/calm";
  Launched reference = launch(job, calm, false);
  REQUIRE(reference.result.exit_code == 0);

  std::string dir = base.path() + "/stopped";
  testing::BackgroundProcess launcher({testing::binary("dtrain"), "launch", job, "--run-dir", dir});
  for (int i = 0; i < 60000 && worker_1_step(dir) < kStepsPerEpoch + 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::map<std::string, int> before = pids(dir);
  ::kill(before.at("worker:1"), SIGSTOP);
  testing::ProcessResult result = launcher.wait(300);
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);

  std::vector<common::JsonDocument> frozen = events(dir, "frozen");
  REQUIRE(frozen.size() == 1);
  CHECK(frozen[0].root().at("task").as_string() == "worker:1");
  CHECK(frozen[0].root().at("pid").as_int(0, 1 << 30) == before.at("worker:1"));
  CHECK(frozen[0].root().at("why").as_string().find("stopped (process state T") == 0);
  std::vector<common::JsonDocument> in_place = events(dir, "in_place");
  REQUIRE(in_place.size() == 1);
  CHECK(in_place[0].root().at("what").as_string().find("frozen: stopped") == 0);
  std::map<std::string, int> after = pids(dir);
  CHECK(after.at("worker:0") == before.at("worker:0"));
  CHECK(after.at("worker:2") == before.at("worker:2"));
  CHECK(common::read_file(dir + "/model/model.safetensors") ==
        common::read_file(calm + "/model/model.safetensors"));
}

// Issue 43: a stop of the whole job (systemctl stop with KillMode=control-group, kill -TERM of the
// process tree) signals the launcher and every worker together. Each worker took its SIGTERM, not
// from its parent, for a preemption of itself alone and left without saving. Now it asks the
// launcher first, which waits a moment for its own stop: the group saves at the agreed step and
// exits 143, as `dtrain stop` does. The workers are signalled before the launcher, the harder
// order.
TEST_CASE("a SIGTERM to every worker and the launcher at once saves at the agreed step") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << job_text("");
  std::string dir = base.path() + "/stopped";
  testing::BackgroundProcess launcher({testing::binary("dtrain"), "launch", job, "--run-dir", dir});
  for (int i = 0; i < 60000 && worker_1_step(dir) < kStepsPerEpoch + 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(worker_1_step(dir) >= kStepsPerEpoch + 10);
  for (const auto& [task, pid] : pids(dir)) ::kill(pid, SIGTERM);
  launcher.signal(SIGTERM);
  testing::ProcessResult result = launcher.wait(120);
  INFO(result.out << result.err);
  CHECK(result.exit_code == 143);
  for (int i = 0; i < 3; ++i) {
    std::string log = common::read_file(dir + "/logs/worker-" + std::to_string(i) + ".log");
    INFO("worker " << i << ":\n" << log);
    CHECK(log.find("preempted alone") == std::string::npos);
    CHECK(log.find("preempted: stopped at epoch ") != std::string::npos);
  }
  // The chief saved a step checkpoint (not an epoch's: step 0), which the next launch resumes
  // from.
  std::string log0 = common::read_file(dir + "/logs/worker-0.log");
  CHECK(std::regex_search(log0, std::regex(R"(saved .* \(epoch [0-9]+ step [1-9][0-9]*\))")));
  std::string launcher_log = result.out + result.err;
  CHECK(launcher_log.find("the job is stopping; it saves with the group") != std::string::npos);
}

// The other side of the rule above: a SIGTERM to one worker alone is confirmed with the launcher,
// which is not stopping, so it preempts that worker alone; a replacement takes its place in place
// and the job succeeds.
TEST_CASE("a SIGTERM to one worker alone, confirmed with the launcher, preempts it alone") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << job_text("");
  std::string dir = base.path() + "/alone";
  testing::BackgroundProcess launcher({testing::binary("dtrain"), "launch", job, "--run-dir", dir});
  for (int i = 0; i < 60000 && worker_1_step(dir) < kStepsPerEpoch + 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(worker_1_step(dir) >= kStepsPerEpoch + 10);
  ::kill(pids(dir).at("worker:1"), SIGTERM);
  testing::ProcessResult result = launcher.wait(300);
  std::string said = result.out + result.err;
  INFO(said);
  CHECK(result.exit_code == 0);
  std::string sender = "SIGTERM from pid " + std::to_string(::getpid());
  CHECK(said.find("worker:1: " + sender + " preempts it alone") != std::string::npos);
  CHECK(common::read_file(dir + "/logs/worker-1.log").find("preempted alone (" + sender) !=
        std::string::npos);
  std::vector<common::JsonDocument> in_place = events(dir, "in_place");
  REQUIRE(in_place.size() == 1);
  CHECK(in_place[0].root().at("task").as_string() == "worker:1");
}

// Issue 43, item 9: the chief SIGKILLed inside epoch 2 and replaced in place. The new chief's
// metrics.jsonl line for that epoch times the whole epoch (its clock travels with the state, as
// the loss totals do): its samples are the epoch's 150 steps of 3 x 8, not only the part the
// new chief ran.
TEST_CASE("a replaced chief's epoch line covers the whole epoch") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << job_text("");
  std::string dir = base.path() + "/chief-killed";
  testing::BackgroundProcess launcher({testing::binary("dtrain"), "launch", job, "--run-dir", dir});
  auto chief_step = [&] {
    std::optional<common::ProgressSample> record =
        common::read_progress_record(dir + "/progress/worker-0");
    return record ? static_cast<int64_t>(record->global_step) : int64_t{-1};
  };
  for (int i = 0; i < 60000 && chief_step() < kStepsPerEpoch + 40; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int64_t killed_after = chief_step();
  ::kill(pids(dir).at("worker:0"), SIGKILL);
  testing::ProcessResult result = launcher.wait(300);
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  INFO("killed after step " << killed_after);
  REQUIRE(events(dir, "in_place").size() == 1);
  std::ifstream in(dir + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    common::JsonDocument m = common::JsonDocument::parse(line, "metrics.jsonl");
    INFO(line);
    double seconds = m.root().at("seconds").as_number(0, 1e9);
    double rate = m.root().at("samples_per_second").as_number(0, 1e12);
    CHECK(seconds * rate == Approx(kStepsPerEpoch * 3 * 8).epsilon(1e-9));
  }
  CHECK(lines == 3);
  // The epoch checkpoint's copy counts the whole epoch's steps (TensorBoard's steps_per_second).
  std::map<std::string, std::string> meta =
      train::read_safetensors_metadata(dir + "/backup/ckpt-0000000300.safetensors");
  common::JsonDocument epoch_2 = common::JsonDocument::parse(meta.at("epoch_metrics"), "metrics");
  CHECK(epoch_2.root().at("epoch").as_int(0, 9) == 2);
  CHECK(epoch_2.root().at("steps").as_int(0, 1 << 20) == kStepsPerEpoch);
}
