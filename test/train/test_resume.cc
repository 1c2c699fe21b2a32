// End to end through `dtrain launch` with two real dtrain-workers and the whole-group restart
// ("recovery": "restart"; test_in_place.cc has the default): an uninterrupted run, a run whose
// worker is SIGKILLed mid-epoch, and a run whose worker is SIGTERMed end with byte-identical final
// models, and the logs show the restart and the resume point.
#include <fmt/format.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/json.h"
#include "common/ports.h"
#include "test/support/language_model_job.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "test/train/tfevents_reader.h"
#include "worker/nn/backend.h"
#include "worker/train/safetensors.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

const char* kJob = R"({"job": "resume", "workers": 2, "recovery": "restart",
 "restart": {"max_restarts": 3, "backoff_seconds": 0.1, "grace_seconds": 10},
 "train": {"model": {"input_shape": [28, 28, 1], "layers": [
   {"type": "conv2d", "filters": 16, "kernel_size": 3, "activation": "relu"},
   {"type": "max_pooling2d"}, {"type": "flatten"}, {"type": "dropout", "rate": 0.2},
   {"type": "dense", "units": 64, "activation": "relu"}, {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "adam", "scale_learning_rate": true, "learning_rate": {
    "type": "cosine_decay", "initial_learning_rate": 0.0005, "warmup_steps": 30,
    "warmup_target": 0.001}},
  "data": {"source": "synthetic", "examples": 2048, "classes": 4},
  "per_worker_batch_size": 32, "epochs": 3, "steps_per_epoch": 60, "seed": 5,
  "backup": {"save_freq": 10, "keep": 2}}})";

// kJob with a residual network with batch normalization instead of its model: the moving
// statistics are state that is not a weight, and must travel with the checkpoints. bn2 is
// synchronized (its statistics summed over the workers inside the step).
std::string residual_job() {
  std::string text = kJob;
  size_t begin = text.find("\"model\":"), end = text.find("\"loss\":");
  text.replace(begin, end - begin, R"("model": {"input_shape": [28, 28, 1], "layers": [
   {"name": "stem", "type": "conv2d", "filters": 8, "kernel_size": 3, "strides": 2,
    "padding": "same"},
   {"name": "bn0", "type": "batch_normalization"}, {"name": "r0", "type": "relu"},
   {"name": "c1", "type": "conv2d", "filters": 8, "kernel_size": 3, "padding": "same"},
   {"name": "bn1", "type": "batch_normalization"}, {"type": "relu"},
   {"name": "c2", "type": "conv2d", "filters": 8, "kernel_size": 3, "padding": "same"},
   {"name": "bn2", "type": "batch_normalization", "synchronized": true},
   {"name": "sum", "type": "add", "inputs": ["r0", "bn2"]}, {"type": "relu"},
   {"type": "max_pooling2d"}, {"type": "flatten"}, {"type": "dense", "units": 4}]},
  )");
  return text;
}

struct Run {
  explicit Run(const std::string& base, const std::string& name) : dir(base + "/" + name) {}
  std::unique_ptr<testing::BackgroundProcess> start(const std::string& job) const {
    return std::make_unique<testing::BackgroundProcess>(
        std::vector<std::string>{testing::binary("dtrain"), "launch", job, "--run-dir", dir});
  }
  // Waits for the step checkpoint of global step `step` (the first one by default); returns the
  // pid of worker 1 of attempt 0.
  int training_worker_1(int step = 10) const {
    const std::string checkpoint = fmt::format("{}/backup/ckpt-{:010d}.safetensors", dir, step);
    for (int i = 0; i < 30000 && !fs::exists(checkpoint); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    REQUIRE(fs::exists(checkpoint));
    auto state = common::JsonDocument::parse(common::read_file(dir + "/state.json"), "state");
    return static_cast<int>(state.root().at("workers").as_array()[1].at("pid").as_int(1, 1 << 30));
  }
  void interrupt_worker_1(int sig, int step = 10) const { ::kill(training_worker_1(step), sig); }
  // The epochs of metrics.jsonl's lines, in order.
  std::vector<int64_t> metric_epochs() const {
    std::vector<int64_t> epochs;
    std::ifstream in(dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      epochs.push_back(
          common::JsonDocument::parse(line, "metrics").root().at("epoch").as_int(1, 99));
    return epochs;
  }
  std::string model() const { return common::read_file(dir + "/model/model.safetensors"); }
  std::string log(int worker) const {
    return common::read_file(dir + "/logs/worker-" + std::to_string(worker) + ".log");
  }
  std::string events() const { return common::read_file(dir + "/events.jsonl"); }
  std::string dir;
};

// How the threads of pid take SIGTERM: how many would run a handler for it (SigCgt), and how many
// have it unblocked (SigBlk; a thread waiting in sigwait shows it unblocked while it waits). A
// signal frame pushed on a thread inside oneDNN's JIT GEMM corrupts the heap (oneDNN issue
// #4845), so dtrain-worker installs no handler: SIGTERM stays blocked and one thread sigwaits.
std::pair<int, int> sigterm_handlers_and_unblocked(int pid) {
  int handlers = 0, unblocked = 0;
  const unsigned long long bit = 1ULL << (SIGTERM - 1);
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream status(task.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("SigCgt:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) & bit))
        ++handlers;
      if (line.rfind("SigBlk:", 0) == 0 && !(std::stoull(line.substr(7), nullptr, 16) & bit))
        ++unblocked;
    }
  }
  return {handlers, unblocked};
}

}  // namespace

TEST_CASE("killed and preempted runs resume to a byte-identical final model") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << kJob;

  Run reference(base.path(), "reference");
  auto r = reference.start(job)->wait(300);
  REQUIRE(r.exit_code == 0);
  std::string expected = reference.model();
  REQUIRE(expected.size() > 100000);
  CHECK_FALSE(fs::exists(reference.dir + "/backup"));  // delete_on_success
  CHECK(fs::exists(reference.dir + "/model/model.json"));

  Run killed(base.path(), "killed");
  auto launcher = killed.start(job);
  killed.interrupt_worker_1(SIGKILL);
  r = launcher->wait(300);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(killed.events().find("\"outcome\":\"preempted\",\"status\":\"killed by SIGKILL\"") !=
        std::string::npos);
  CHECK(killed.log(0).find("==== dtrain: attempt 1 of worker:0") != std::string::npos);
  CHECK(killed.log(0).find(": resuming at epoch 1 step ") != std::string::npos);
  CHECK(killed.model() == expected);

  Run preempted(base.path(), "preempted");
  launcher = preempted.start(job);
  int worker = preempted.training_worker_1();
  auto [handlers, unblocked] = sigterm_handlers_and_unblocked(worker);
  CHECK(handlers == 0);
  CHECK(unblocked <= 1);  // the sigwait thread
  ::kill(worker, SIGTERM);
  r = launcher->wait(300);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(preempted.events().find("\"task\":\"worker:1\",\"pid\"") != std::string::npos);
  CHECK(preempted.log(1).find("preempted: stopped at epoch 1 step ") != std::string::npos);
  CHECK(preempted.log(0).find("preempted: stopped at epoch 1 step ") != std::string::npos);
  CHECK(preempted.log(0).find(": resuming at epoch 1 step ") != std::string::npos);
  CHECK(preempted.model() == expected);
}

TEST_CASE("a residual network with batch normalization resumes bit-exactly after a kill") {
  // In float32, and in mixed_bfloat16 where the CPU computes in it (bf16 products; elsewhere the
  // worker refuses the policy, test_backend_parity's case).
  std::string policy = GENERATE(as<std::string>{}, "float32", "mixed_bfloat16");
  INFO(policy);
  if (policy == "mixed_bfloat16" && !nn::cpu_supports(nn::MathMode::kBfloat16)) {
    WARN("this CPU (" << nn::cpu_isa_name() << ") has no bf16 products: float32 only");
    return;
  }
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::string text = residual_job();
  text.replace(text.find(R"("per_worker_batch_size")"), 0,
               R"("dtype_policy": ")" + policy + R"(", )");
  std::ofstream(job) << text;
  Run reference(base.path(), "reference");
  auto r = reference.start(job)->wait(300);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::string expected = reference.model();
  REQUIRE(expected.find("bn1.moving_mean") != std::string::npos);

  Run killed(base.path(), "killed");
  auto launcher = killed.start(job);
  killed.interrupt_worker_1(SIGKILL);
  r = launcher->wait(300);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(killed.log(0).find(": resuming at epoch 1 step ") != std::string::npos);
  CHECK(killed.model() == expected);
}

TEST_CASE("a character GPT on text resumes bit-exactly after a kill") {
  // Its training windows are drawn from (seed, epoch, step, example), its dropout from the step:
  // the resumed run draws what the undisturbed one drew.
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << testing::with_language_model(kJob);
  Run reference(base.path(), "reference");
  auto r = reference.start(job)->wait(300);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::string expected = reference.model();
  REQUIRE(expected.find("attention.query.kernel") != std::string::npos);

  Run killed(base.path(), "killed");
  auto launcher = killed.start(job);
  killed.interrupt_worker_1(SIGKILL);
  r = launcher->wait(300);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(killed.log(0).find(": resuming at epoch 1 step ") != std::string::npos);
  CHECK(killed.model() == expected);
}

TEST_CASE("an evaluator task scores checkpoints and the final model into eval.jsonl") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::string text = kJob;
  text.replace(
      text.find("\"workers\": 2"), 12,
      R"("cluster": {"worker": ["localhost:0", "localhost:0"], "evaluator": ["localhost:0"]})");
  for (int port : common::pick_free_ports(3)) {  // explicit clusters need real ports
    text.replace(text.find("localhost:0\""), 12, "localhost:" + std::to_string(port) + "\"");
  }
  std::ofstream(job) << text;
  Run run(base.path(), "evaluated");
  auto r = run.start(job)->wait(300);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::ifstream eval(run.dir + "/eval.jsonl");
  std::string line, last;
  int lines = 0;
  for (; std::getline(eval, line); ++lines) last = line;
  CHECK(lines >= 1);
  auto doc = common::JsonDocument::parse(last, "eval.jsonl");
  CHECK(doc.root().at("model").as_string() == "final");
  CHECK(doc.root().at("val_accuracy").as_number(0, 1) > 0.9);
}

// Issue 43, item 5: a kill at the very end. The chief wrote model/ and deleted every checkpoint
// (delete_on_success); a worker killed before the launcher recorded the group's success makes
// it restart. That restart of the launch (DTRAIN_ATTEMPT 1, as the launcher starts it) finds no
// checkpoint, takes the model/ this launch wrote for finished training and trains nothing
// again. After a new launch (spec.json written again) the same model is older than the launch,
// and a start trains as before.
TEST_CASE("a restart after the final model was written finishes without training again") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json";
  std::ofstream(job) << R"({"job": "end", "workers": 1,
 "train": {"model": {"input_shape": [8, 8, 1], "layers": [{"type": "flatten"},
   {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "sgd", "learning_rate": 0.01},
  "data": {"source": "synthetic", "examples": 256, "classes": 4},
  "per_worker_batch_size": 8, "epochs": 2, "steps_per_epoch": 5, "seed": 3,
  "backup": {"save_freq": "epoch", "keep": 2, "delete_on_success": true}}})";
  std::string dir = base.path() + "/run";
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  testing::ProcessResult launched =
      testing::run_process({testing::binary("dtrain"), "launch", job, "--run-dir", dir}, options);
  INFO(launched.out << launched.err);
  REQUIRE(launched.exit_code == 0);
  REQUIRE_FALSE(fs::exists(dir + "/backup"));
  std::string model = common::read_file(dir + "/model/model.safetensors");
  auto metrics_lines = [&] {
    std::ifstream in(dir + "/metrics.jsonl");
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  REQUIRE(metrics_lines() == 2);

  options.env["DTRAIN_ATTEMPT"] = "1";
  std::vector<std::string> worker = {testing::binary("dtrain-worker"), "--config", job, "--run-dir",
                                     dir};
  testing::ProcessResult restarted = testing::run_process(worker, options);
  INFO(restarted.out << restarted.err);
  REQUIRE(restarted.exit_code == 0);
  CHECK((restarted.out + restarted.err).find("nothing is left to train") != std::string::npos);
  CHECK(metrics_lines() == 2);  // no epoch trained again
  CHECK(common::read_file(dir + "/model/model.safetensors") == model);

  // The final state in model/state is what a later launch goes on from: with one more epoch, a
  // lone worker trains that epoch alone.
  REQUIRE(fs::exists(dir + "/model/state/checkpoint.json"));
  std::string longer = common::read_file(job);
  longer.replace(longer.find("\"epochs\": 2"), 11, "\"epochs\": 3");
  common::write_file_atomically(job, longer);
  options.env.erase("DTRAIN_ATTEMPT");
  testing::ProcessResult continued = testing::run_process(worker, options);
  INFO(continued.out << continued.err);
  REQUIRE(continued.exit_code == 0);
  CHECK((continued.out + continued.err).find("continuing the finished run") != std::string::npos);
  CHECK(metrics_lines() == 3);  // epoch 3 alone
}

// Issue 46, must-show 1: a finished 2-epoch run launched again with "epochs": 3 continues from
// its final state (weights, Adam's slots, the moving statistics of batch normalization, the
// schedule's step, the data position) to the model of an uninterrupted 3-epoch run, bit for bit,
// and metrics.jsonl holds epochs 1-3 once each. The dry run and the launch's first line say so;
// a launch with fewer epochs, or other settings and the same epochs, is refused with exit 2.
TEST_CASE("a finished run launched with more epochs continues to the longer run's model") {
  testing::TempDir base;
  std::string text = residual_job();
  // decay_steps given: a schedule that follows train.epochs would change with the continuation.
  const std::string warmup = "\"warmup_steps\": 30";
  text.replace(text.find(warmup), warmup.size(), warmup + ", \"decay_steps\": 150");
  auto job_with = [&](int epochs, const std::string& name) {
    std::string t = text;
    t.replace(t.find("\"epochs\": 3"), 11, "\"epochs\": " + std::to_string(epochs));
    std::string path = base.path() + "/" + name;
    std::ofstream(path) << t;
    return path;
  };
  const std::string two = job_with(2, "two.json"), three = job_with(3, "three.json");
  Run whole(base.path(), "whole"), continued(base.path(), "continued");
  testing::ProcessResult w = whole.start(three)->wait(300);
  INFO(w.out << w.err);
  REQUIRE(w.exit_code == 0);

  testing::ProcessResult first = continued.start(two)->wait(300);
  INFO(first.out << first.err);
  REQUIRE(first.exit_code == 0);
  REQUIRE_FALSE(fs::exists(continued.dir + "/backup/checkpoint.json"));  // delete_on_success
  auto dtrain = [&](std::vector<std::string> args) {
    args.insert(args.begin(), testing::binary("dtrain"));
    testing::ProcessOptions options;
    options.timeout_seconds = 300;
    return testing::run_process(args, options);
  };
  testing::ProcessResult dry = dtrain({"launch", three, "--run-dir", continued.dir, "--dry-run"});
  INFO(dry.out << dry.err);
  REQUIRE(dry.exit_code == 0);
  CHECK(dry.out.find("# a launch continues the finished run from epoch 2 to epoch 3") !=
        std::string::npos);
  testing::ProcessResult fewer =
      dtrain({"launch", job_with(1, "one.json"), "--run-dir", continued.dir});
  CHECK(fewer.exit_code == 2);
  CHECK((fewer.out + fewer.err).find("only a larger train.epochs continues a finished run") !=
        std::string::npos);
  std::string other = common::read_file(two);
  other.replace(other.find("\"seed\": 5"), 9, "\"seed\": 6");  // 9: the text replaced
  std::ofstream(base.path() + "/other.json") << other;
  testing::ProcessResult changed =
      dtrain({"launch", base.path() + "/other.json", "--run-dir", continued.dir});
  CHECK(changed.exit_code == 2);
  CHECK((changed.out + changed.err).find("train.seed changed") != std::string::npos);

  testing::ProcessResult second = continued.start(three)->wait(300);
  INFO(second.out << second.err);
  REQUIRE(second.exit_code == 0);
  CHECK((second.out + second.err).find("it continues the finished run from epoch 2 to epoch 3") !=
        std::string::npos);
  CHECK(continued.model() == whole.model());
  CHECK(continued.metric_epochs() == std::vector<int64_t>{1, 2, 3});
  CHECK(common::read_file(continued.dir + "/model/state/checkpoint.json").find("0000000180") !=
        std::string::npos);  // the final state moved on with the run
}

// Issue 46, item 3: EarlyStopping's state (the best value, the wait, the best weights) travels
// with the checkpoints. Monitoring the loss in "max" mode with patience 2, the uninterrupted run
// stops after epoch 3 of 5 and restores epoch 1's weights. A worker SIGKILLed inside epoch 2
// makes the group resume from a checkpoint taken after epoch 1 was judged; had the state not
// travelled, epoch 2 would be judged first, and the run would stop after epoch 4 with epoch 2's
// weights.
TEST_CASE("EarlyStopping's state survives a kill: the same stop and the same model") {
  testing::TempDir base;
  std::string text = kJob;
  text.replace(text.find("\"epochs\": 3"), 11, "\"epochs\": 5");
  const std::string backup = "\"backup\": {\"save_freq\": 10, \"keep\": 2}";
  text.replace(text.find(backup), backup.size(),
               backup + R"(, "callbacks": [{"class_name": "EarlyStopping", "config": {
                 "monitor": "loss", "mode": "max", "patience": 2, "restore_best_weights": true}}])");
  const std::string job = base.path() + "/job.json";
  std::ofstream(job) << text;
  Run whole(base.path(), "whole"), killed(base.path(), "killed");
  testing::ProcessResult w = whole.start(job)->wait(300);
  INFO(w.out << w.err);
  REQUIRE(w.exit_code == 0);
  CHECK(whole.log(0).find("Epoch 3: early stopping") != std::string::npos);
  CHECK(whole.log(0).find("Restoring model weights from the end of the best epoch: 1.") !=
        std::string::npos);

  auto launcher = killed.start(job);
  killed.interrupt_worker_1(SIGKILL, 70);  // inside epoch 2
  testing::ProcessResult k = launcher->wait(300);
  INFO(k.out << k.err);
  REQUIRE(k.exit_code == 0);
  CHECK(killed.events().find("\"restart\"") != std::string::npos);
  CHECK(killed.log(0).find("Epoch 3: early stopping") != std::string::npos);
  CHECK(killed.model() == whole.model());
  CHECK(killed.metric_epochs() == std::vector<int64_t>{1, 2, 3});
}

// Issue 46, item 3: ReduceLROnPlateau's reduced rate travels with its state. Monitoring the loss
// in "max" mode with patience 1 and factor 0.5, the rate halves after epochs 2 and 3; a worker
// SIGKILLed inside epoch 3 makes the group resume with the halved rate (epoch 2's reduction) and
// end with the undisturbed run's model. Had the rate not been restored, epoch 3's rest would run
// at the job's rate.
TEST_CASE("ReduceLROnPlateau's rate survives a kill: the same reductions and the same model") {
  testing::TempDir base;
  std::string text = kJob;
  const size_t opt = text.find("\"optimizer\":"), loss_end = text.find("\"data\":");
  text.replace(opt, loss_end - opt, R"("optimizer": {"type": "adam", "learning_rate": 0.001},
  )");
  const std::string backup = "\"backup\": {\"save_freq\": 10, \"keep\": 2}";
  text.replace(text.find(backup), backup.size(),
               backup + R"(, "callbacks": [{"class_name": "ReduceLROnPlateau", "config": {
                 "monitor": "loss", "mode": "max", "patience": 1, "factor": 0.5}}])");
  const std::string job = base.path() + "/job.json";
  std::ofstream(job) << text;
  Run whole(base.path(), "whole"), killed(base.path(), "killed");
  testing::ProcessResult w = whole.start(job)->wait(300);
  INFO(w.out << w.err);
  REQUIRE(w.exit_code == 0);
  CHECK(whole.log(0).find("Epoch 2: ReduceLROnPlateau reducing learning rate to 0.0005.") !=
        std::string::npos);
  CHECK(whole.log(0).find("Epoch 3: ReduceLROnPlateau reducing learning rate to 0.00025.") !=
        std::string::npos);
  // TensorBoard logs the rate each epoch trained with, as Keras's (which logs it before the
  // callback reduces it): epoch 2 (step 1) trained at 0.001, epoch 3 at 0.0005.
  testing::ScalarsByTag scalars =
      testing::by_tag(testing::read_events(base.path() + "/whole/tensorboard/train"));
  const std::map<int64_t, double>& rates = scalars.at("epoch_learning_rate");
  CHECK(rates.at(0) == Approx(0.001));
  CHECK(rates.at(1) == Approx(0.001));
  CHECK(rates.at(2) == Approx(0.0005));

  auto launcher = killed.start(job);
  killed.interrupt_worker_1(SIGKILL, 130);  // inside epoch 3
  testing::ProcessResult k = launcher->wait(300);
  INFO(k.out << k.err);
  REQUIRE(k.exit_code == 0);
  CHECK(killed.events().find("\"restart\"") != std::string::npos);
  CHECK(killed.model() == whole.model());
}

TEST_CASE("a resumed epoch's record times the whole epoch, its part before the stop included") {
  // A lone worker whose steps take 20 ms is stopped by SIGTERM inside its only epoch: the
  // checkpoint it saves keeps the epoch's clock, and the run that resumes from it records the
  // epoch's seconds from that clock on (issue 46: a stop at an epoch's last step recorded an epoch
  // of no time and 0 samples/s).
  testing::TempDir dir;
  const std::string job = dir.path() + "/job.json", run = dir.path() + "/run";
  std::ofstream(job) << R"({"train": {"model": {"input_shape": [8, 8, 1], "layers": [
      {"type": "flatten"}, {"type": "dense", "units": 4}]},
    "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
    "data": {"source": "synthetic", "examples": 512, "classes": 4},
    "per_worker_batch_size": 8, "epochs": 1, "steps_per_epoch": 100, "seed": 2,
    "tensorboard": false, "backup": {"delete_on_success": false}}})";
  testing::ProcessOptions options;
  options.env["TF_CONFIG"] = std::nullopt;
  options.env["DTRAIN_TEST_SLOW_STEP_MS"] = "0:20";
  const std::vector<std::string> argv = {testing::binary("dtrain-worker"), "--config", job,
                                         "--run-dir", run};
  {
    testing::BackgroundProcess worker(argv, options);
    for (int i = 0; i < 600 && worker.out_so_far().find("Epoch 1/1") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // some steps, not all 100
    worker.signal(SIGTERM);
    auto stopped = worker.wait(120);
    INFO(stopped.out << stopped.err);
    REQUIRE(stopped.exit_code != 0);
    REQUIRE(stopped.err.find("stopped at epoch 1 step ") != std::string::npos);
  }
  std::string checkpoint;
  for (const auto& entry : fs::directory_iterator(run + "/backup"))
    if (entry.path().extension() == ".safetensors") checkpoint = entry.path().string();
  REQUIRE_FALSE(checkpoint.empty());
  auto metadata = train::read_safetensors_metadata(checkpoint);
  CHECK(metadata["epoch_first_step"] == "0");
  const double before = std::stod(metadata["epoch_seconds"]);
  CHECK(before > 0);
  CHECK(std::stod(metadata["epoch_samples"]) == 8 * (std::stod(metadata["step"])));

  auto resumed = testing::run_process(argv, options);
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  common::JsonDocument line =
      common::JsonDocument::parse(common::read_file(run + "/metrics.jsonl"), "metrics.jsonl");
  CHECK(line.root().at("seconds").as_number(0, 1e9) >= before);
  // Every example of the epoch was counted: 800 samples over the whole epoch's seconds.
  const double rate = line.root().at("samples_per_second").as_number(0, 1e12);
  CHECK(rate * line.root().at("seconds").as_number(0, 1e9) == Approx(800).epsilon(1e-6));
}
