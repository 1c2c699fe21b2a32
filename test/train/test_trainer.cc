// The fit loop on the oneDNN backend: bit-identical weights for one seed, learning on synthetic
// data with every layer type, Keras-style progress text, metrics.jsonl, configuration errors
// naming their JSON path, and corrupt data files failing dtrain-worker with exit 2; a backup.dir
// outside the run directory, a checkpoint tensor of the wrong size and running out of memory are
// exit 2 too, and a successful run deletes only its own checkpoints. A spare's warm model (one
// warm-up step, then put back) trains to the same bits as a fresh one.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "test/train/solo_fit.h"
#include "worker/comm/ring_communicator.h"
#include "worker/data/dataset.h"
#include "worker/gpu/gpu_info.h"
#include "worker/nn/backend.h"
#include "worker/train/model_parts.h"
#include "worker/train/progress.h"
#include "worker/train/trainer.h"

using namespace dtrain;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const char* kTrain = R"({
  "model": {"input_shape": [10, 10, 2], "layers": [
    {"type": "conv2d", "filters": 6, "kernel_size": 3, "padding": "same", "activation": "relu"},
    {"type": "max_pooling2d", "pool_size": 2},
    {"type": "conv2d", "filters": 4, "kernel_size": [2, 3], "strides": [1, 2]},
    {"type": "relu"},
    {"type": "flatten"},
    {"type": "dropout", "rate": 0.25},
    {"type": "dense", "units": 16, "activation": "relu"},
    {"type": "dense", "units": 5, "activation": "softmax"}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": false},
  "optimizer": {"type": "adam", "learning_rate": 0.01},
  "data": {"source": "synthetic", "examples": 600, "classes": 5},
  "per_worker_batch_size": 32, "epochs": 4, "validation": true, "seed": SEED})";

train::TrainConfig config(int seed) {
  std::string text = kTrain;
  text.replace(text.find("SEED"), 4, std::to_string(seed));
  return train::parse_train_config(text, "job.json");
}

std::vector<float> train_once(const train::TrainConfig& c, const std::string& run_dir,
                              train::EpochMetrics* last = nullptr) {
  return testing::solo_fit(c, run_dir, {.last = last});
}

}  // namespace

TEST_CASE("two runs with one seed end with bit-identical weights; another seed differs") {
  testing::TempDir dir;
  std::vector<float> a = train_once(config(42), dir.path());
  std::vector<float> b = train_once(config(42), dir.path());
  std::vector<float> c = train_once(config(43), dir.path());
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) != 0);
}

// docs/design.md#spares. The schedule decays over the run and scales by the workers, so the
// trainer must resolve it again for its run (the spare resolved it for one step of one worker).
TEST_CASE("a spare's warm model trains to the bits of a fresh one: the warm-up leaves no trace") {
  std::string text = kTrain;
  text.replace(text.find("SEED"), 4, "7");
  const std::string adam = R"({"type": "adam", "learning_rate": 0.01})";
  text.replace(text.find(adam), adam.size(),
               R"({"type": "adam", "scale_learning_rate": true,
                   "learning_rate": {"type": "cosine_decay", "initial_learning_rate": 0.01}})");
  train::TrainConfig c = train::parse_train_config(text, "job.json");

  SECTION("the parts: initial weights, zero slots and count, as freshly built") {
    auto backend = nn::make_dnnl_backend();
    auto [train_data, test_data] =
        data::load_data(c.data, {c.model.height, c.model.width, c.model.channels});
    train::ModelParts fresh = train::build_model_parts(c, *backend, train_data.classes);
    train::ModelParts warm = train::warm_model_parts(c, *backend, train_data);
    CHECK(warm.model->parameters().to_host() == fresh.model->parameters().to_host());
    CHECK(warm.optimizer->iterations() == 0);
    REQUIRE(warm.optimizer->slots().size() == 2);  // adam.m, adam.v
    for (auto& [name, slot] : warm.optimizer->slots()) {
      INFO(name);
      CHECK(slot->to_host() == std::vector<float>(slot->size(), 0.0f));
    }
    std::vector<float> gradients = warm.model->gradients().to_host();
    CHECK(gradients == std::vector<float>(gradients.size(), 0.0f));
  }
  SECTION("a whole run, by the bits") {
    testing::TempDir fresh_dir, warm_dir;
    std::vector<float> fresh = testing::solo_fit(c, fresh_dir.path());
    std::vector<float> warm = testing::solo_fit(c, warm_dir.path(), {.warm = true});
    REQUIRE(fresh.size() == warm.size());
    CHECK(std::memcmp(fresh.data(), warm.data(), fresh.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("every layer type trains: synthetic data is learned and metrics.jsonl has each epoch") {
  testing::TempDir dir;
  train::EpochMetrics last;
  train_once(config(7), dir.path(), &last);
  CHECK(last.epoch == 4);
  CHECK(last.accuracy > 0.9);
  CHECK(last.val_accuracy > 0.9);
  std::ifstream metrics(dir.path() + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    auto doc = common::JsonDocument::parse(line, "metrics");
    CHECK(doc.root().at("epoch").as_int(1, 4) == lines + 1);
    for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy", "seconds",
                            "samples_per_second", "step_seconds"}) {
      CHECK(doc.root().find(key).has_value());
    }
    // The steps' own time is part of the epoch's: more than none, no more than all.
    const double seconds = doc.root().at("seconds").as_number(0, 1e9);
    const double in_steps = doc.root().at("step_seconds").as_number(0, 1e9);
    CHECK(in_steps > 0.0);
    CHECK(in_steps <= seconds);
  }
  CHECK(lines == 4);
}

TEST_CASE("progress lines look like Keras's") {
  CHECK(train::format_progress(70, 70, 1.4, {{"loss", 2.28434}, {"accuracy", 0.15981}}) ==
        "70/70 [==============================] - 1s 20ms/step - loss: 2.2843 - accuracy: 0.1598");
  CHECK(train::format_progress(35, 70, 0.5, {}) ==
        "35/70 [===============>..............] - 0s 14ms/step");
}

TEST_CASE("train config mistakes are ConfigErrors naming the JSON path") {
  auto error = [](const std::string& edit_from, const std::string& edit_to) {
    std::string text = kTrain;
    text.replace(text.find("SEED"), 4, "1");
    size_t at = text.find(edit_from);
    REQUIRE(at != std::string::npos);
    text.replace(at, edit_from.size(), edit_to);
    try {
      train::parse_train_config(text, "job.json");
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(error("\"type\": \"relu\"", "\"type\": \"rleu\""),
             Catch::StartsWith("job.json: train.model.layers[3].type: unknown layer type \"rleu\" "
                               "(did you mean \"relu\"? expected conv2d, max_pooling2d, ") &&
                 Catch::Contains(", relu"));
  CHECK(error("\"from_logits\": false", "\"from_logits\": true")
            .find("job.json: train.loss: from_logits is true") == 0);
  CHECK(error("\"from_logits\": false", "\"from_logits\": false, \"label_smoothing\": 1.5")
            .find("job.json: train.loss.label_smoothing:") == 0);
  CHECK(error("\"adam\"", "\"adagrad\"") ==
        "job.json: train.optimizer.type: unknown optimizer \"adagrad\" (expected sgd, adam, adamw "
        "or rmsprop)");
  CHECK(error("\"per_worker_batch_size\": 32", "\"per_worker_batch_size\": 0")
            .find("job.json: train.per_worker_batch_size:") == 0);
  CHECK(error("\"rate\": 0.25", "\"rate\": 1.5").find("job.json: train.model.layers[5].rate:") ==
        0);
  CHECK(error("\"epochs\": 4", "\"epochs\": 4, \"epoch\": 2")
            .find("job.json: train: unknown key \"epoch\"") == 0);
  CHECK(error("\"padding\": \"same\"", "\"padding\": \"full\"")
            .find("job.json: train.model.layers[0].padding:") == 0);
}

TEST_CASE("a layer that does not fit its input is a ConfigError naming the layer") {
  std::string text = kTrain;
  text.replace(text.find("SEED"), 4, "1");
  text.replace(text.find("\"kernel_size\": [2, 3]"), 21, "\"kernel_size\": 9");
  CHECK_THROWS_WITH(
      train::parse_train_config(text, "job.json"),
      Catch::StartsWith(
          "job.json: train.model.layers[2]: a 9x9 kernel does not fit the 5x5 input"));
}

TEST_CASE("dtrain-worker exits 2 naming the file when the data files are corrupt") {
  testing::TempDir dir;
  std::string images = dir.path() + "/train-images-idx3-ubyte";
  std::string labels = dir.path() + "/train-labels-idx1-ubyte";
  unsigned char image_header[16] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28};
  std::ofstream(images, std::ios::binary)
      .write(reinterpret_cast<char*>(image_header), 16);  // no pixels
  unsigned char label_header[10] = {0, 0, 8, 1, 0, 0, 0, 2, 1, 2};
  std::ofstream(labels, std::ios::binary).write(reinterpret_cast<char*>(label_header), 10);
  std::string job = dir.path() + "/job.json";
  std::ofstream(job)
      << R"({"job": "bad-data", "workers": 1, "train": {"model": {"input_shape": [28, 28, 1], "layers": [
      {"type": "flatten"}, {"type": "dense", "units": 10}]}, "loss": {"type": "sparse_categorical_crossentropy",
      "from_logits": true}, "data": {"source": "idx", "train_images": ")"
      << images << R"(", "train_labels": ")" << labels << R"(", "test_images": ")" << images
      << R"(", "test_labels": ")" << labels << R"("}}})";
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", job, "--run-dir", dir.path() + "/run"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(images + ": truncated") != std::string::npos);
}

TEST_CASE("NCCL or CUDA where they cannot run is exit 2 naming them; auto picks and logs") {
  testing::TempDir dir;
  auto job_with = [&](const std::string& device, const std::string& communication,
                      const testing::ProcessOptions& options = {}) {
    std::string job = dir.path() + "/" + device + "-" + communication + ".json";
    std::ofstream(job) << R"({"job": "choice", "train": {"model": {"input_shape": [4, 4, 1],
        "layers": [{"type": "flatten"}, {"type": "dense", "units": 3}]},
        "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
        "data": {"source": "synthetic", "examples": 64, "classes": 3},
        "per_worker_batch_size": 8, "epochs": 1, "device": ")"
                       << device << R"(", "communication": ")" << communication << R"("}})";
    return testing::run_process(
        {testing::binary("dtrain-worker"), "--config", job, "--run-dir", dir.path() + "/run"},
        options);
  };
  bool gpu_here = gpu::probe_build().compiled && gpu::probe_build().device_count > 0;
  if (gpu_here) {
    WARN("a GPU is visible: the refusals for CPU workers are checked with device \"cpu\" only");
  }
  auto cpu_nccl = job_with("cpu", "nccl");
  CHECK(cpu_nccl.exit_code == 2);
  CHECK(cpu_nccl.err.find("\"nccl\"") != std::string::npos);
  CHECK(cpu_nccl.err.find("NCCL") != std::string::npos);
  if (!gpu_here) {
    auto cuda = job_with("cuda", "auto");
    CHECK(cuda.exit_code == 2);
    CHECK(cuda.err.find("train.device: \"cuda\"") != std::string::npos);
    auto auto_nccl = job_with("auto", "nccl");  // auto picks the CPU here, so NCCL cannot run
    CHECK(auto_nccl.exit_code == 2);
    CHECK(auto_nccl.err.find("NCCL") != std::string::npos);
    auto fine = job_with("auto", "auto");
    CHECK(fine.exit_code == 0);
    // On a CPU machine the device line names the CPU only: no word of CUDA or GPUs.
    CHECK(fine.err.find("device: cpu (oneDNN)\n") != std::string::npos);
    CHECK(fine.err.find("CUDA") == std::string::npos);
    CHECK(fine.err.find("GPU") == std::string::npos);
    CHECK(fine.err.find(" I [worker 0] device: cpu (oneDNN)\n") != std::string::npos);
    // Under the launcher (DTRAIN_RUN_DIR set) the launcher adds the role: the worker does not.
    testing::ProcessOptions launched;
    launched.env["DTRAIN_RUN_DIR"] = dir.path() + "/run";
    auto supervised = job_with("auto", "auto", launched);
    CHECK(supervised.exit_code == 0);
    CHECK(supervised.err.find(" I device: cpu (oneDNN)\n") != std::string::npos);
    CHECK(supervised.err.find("[worker 0]") == std::string::npos);
  }
}

TEST_CASE(
    "two workers on one host: auto picks shared memory, ring and shm can be asked for, and "
    "all three train to the same weights") {
  testing::TempDir dir;
  auto launch_with = [&](const std::string& communication) {
    std::string job = dir.path() + "/" + communication + ".json";
    std::string run = dir.path() + "/run-" + communication;
    std::ofstream(job) << R"({"job": "transport", "workers": 2, "restart": {"max_restarts": 0},
        "train": {"model": {"input_shape": [4, 4, 1],
        "layers": [{"type": "flatten"}, {"type": "dense", "units": 8, "activation": "relu"},
                   {"type": "dense", "units": 3}]},
        "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
        "data": {"source": "synthetic", "examples": 256, "classes": 3},
        "per_worker_batch_size": 8, "epochs": 2, "device": "cpu", "communication": ")"
                       << communication << R"("}})";
    auto r = testing::run_process({testing::binary("dtrain"), "launch", job, "--run-dir", run});
    INFO(r.out << r.err);
    CHECK(r.exit_code == 0);
    return std::make_pair(common::read_file(run + "/logs/worker-1.log"),
                          common::read_file(run + "/model/model.safetensors"));
  };
  auto [auto_log, auto_model] = launch_with("auto");
  auto [ring_log, ring_model] = launch_with("ring");
  auto [shm_log, shm_model] = launch_with("shm");
  CHECK(auto_log.find("communication: shared memory, gradient buckets") != std::string::npos);
  CHECK(ring_log.find("communication: TCP ring, gradient buckets") != std::string::npos);
  CHECK(shm_log.find("communication: shared memory, gradient buckets") != std::string::npos);
  // With shared memory the gradients live in the window, where the peers sum them in place.
  CHECK(shm_log.find("live in the shared-memory window") != std::string::npos);
  CHECK(ring_log.find("shared-memory window") == std::string::npos);
  REQUIRE(auto_model.size() > 100);
  CHECK(auto_model == ring_model);  // two ranks: each sum is one addition, whatever the transport
  CHECK(shm_model == ring_model);
}

namespace {

const char* kSmallJob = R"({"job": "small", "train": {"model": {"input_shape": [4, 4, 1],
    "layers": [{"type": "flatten"}, {"type": "dense", "units": 3}]},
    "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
    "data": {"source": "synthetic", "examples": 64, "classes": 3},
    "per_worker_batch_size": 8, "epochs": 1, "device": "cpu", "backup": BACKUP}})";

std::string small_job(const std::string& backup) {
  std::string text = kSmallJob;
  text.replace(text.find("BACKUP"), 6, backup);
  return text;
}

}  // namespace

TEST_CASE("backup.dir must name a folder inside the run directory") {
  auto error = [](const std::string& dir) {
    try {
      train::parse_train_config(
          common::JsonDocument::parse(small_job(R"({"dir": )" + common::json_quote(dir) + "}"), "j")
              .root()
              .at("train")
              .dump(),
          "job.json");
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const char* bad : {".", "./", "..", "../victim", "a/../../b", "/tmp/x", "model", "logs/b",
                          "metrics.jsonl", "tensorboard/x"}) {
    INFO(bad);
    CHECK_THAT(error(bad), Catch::StartsWith("job.json: train.backup.dir: \"") &&
                               Catch::Contains("is not a folder inside the run directory"));
  }
  CHECK_THAT(error(std::string("b\0/../x", 7)), Catch::Contains("control character"));
  CHECK(error("backup") == "accepted");
  CHECK(error("checkpoints/run-1") == "accepted");
  CHECK(error("modelbackup") == "accepted");
}

TEST_CASE("a successful run removes only its checkpoints; a backup.dir outside is exit 2") {
  testing::TempDir dir;
  std::string run = dir.path() + "/run", victim = dir.path() + "/victim";
  fs::create_directories(victim);
  std::ofstream(victim + "/precious.txt") << "keep me";
  for (const char* escape : {R"({"dir": "../victim"})", R"({"dir": "."})"}) {
    std::string job = dir.path() + "/escape.json";
    std::ofstream(job, std::ios::trunc) << small_job(escape);
    auto r =
        testing::run_process({testing::binary("dtrain-worker"), "--config", job, "--run-dir", run});
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("train.backup.dir") != std::string::npos);
  }
  CHECK(common::read_file(victim + "/precious.txt") == "keep me");
  // A file of the user's in the backup folder survives the success clean-up, and so does the
  // folder holding it; the model and metrics are there.
  std::string job = dir.path() + "/ok.json";
  std::ofstream(job) << small_job(R"({"dir": "ckpts", "save_freq": 2})");
  fs::create_directories(run + "/ckpts");
  std::ofstream(run + "/ckpts/README") << "mine";
  auto r =
      testing::run_process({testing::binary("dtrain-worker"), "--config", job, "--run-dir", run});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(fs::exists(run + "/model/model.safetensors"));
  CHECK(fs::exists(run + "/metrics.jsonl"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(run + "/ckpts")) left.push_back(e.path().filename());
  CHECK(left == std::vector<std::string>{"README"});
}

// Issue 25 (12): a file where the backup folder goes trained each attempt up to the first save,
// then failed there ("Not a directory") as if restartable.
TEST_CASE("a file in the backup folder's way is exit 2 naming train.backup.dir, before any step") {
  testing::TempDir dir;
  std::string run = dir.path() + "/run";
  fs::create_directories(run);
  for (const auto& [backup, in_the_way] :
       {std::pair<std::string, std::string>{"backup", "backup"}, {"ckpts/a", "ckpts"}}) {
    INFO(backup);
    std::ofstream(run + "/" + in_the_way) << "not a folder";
    std::string job = dir.path() + "/job.json";
    std::ofstream(job, std::ios::trunc) << small_job(R"({"dir": ")" + backup + R"("})");
    auto r =
        testing::run_process({testing::binary("dtrain-worker"), "--config", job, "--run-dir", run});
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("train.backup.dir: cannot use " + run + "/" + backup) != std::string::npos);
    CHECK(r.out.find("Epoch 1/1") == std::string::npos);  // no step was trained
    CHECK_FALSE(fs::exists(run + "/metrics.jsonl"));
    CHECK(common::read_file(run + "/" + in_the_way) == "not a folder");
  }
}

TEST_CASE("a checkpoint with a good checksum but a tensor of the wrong size stops the restore") {
  testing::TempDir dir;
  train::TrainConfig c = config(5);
  // This model's architecture and tensor names, one kernel a value short.
  std::map<std::string, std::string> m = {{"format", "dtrain-checkpoint"},
                                          {"format_version", "2"},
                                          {"architecture", c.model_json},
                                          {"epoch", "1"},
                                          {"step", "0"},
                                          {"global_step", "19"},
                                          {"optimizer_iterations", "19"},
                                          {"epoch_loss_sum", "0"},
                                          {"epoch_correct", "0"},
                                          {"epoch_seen", "0"}};
  auto backend = nn::make_dnnl_backend();
  nn::Model model(c.model, *backend, 8);
  std::vector<train::TensorView> views;
  std::vector<std::vector<float>> data;
  for (const nn::ParamInfo& p : model.parameter_infos()) {
    data.emplace_back(p.count - (views.empty() ? 1 : 0), 0.25f);
    std::vector<int64_t> shape = p.shape;
    if (views.empty()) shape = {static_cast<int64_t>(p.count - 1)};
    views.push_back({p.name, shape, data.back().data(), data.back().size()});
  }
  fs::create_directories(dir.path() + "/backup");
  common::write_file_atomically(
      dir.path() + "/backup/ckpt-0000000019.safetensors",
      train::encode_safetensors(views, m, train::ChecksumScope::kIndexToo));
  CHECK_THROWS_WITH(train_once(c, dir.path()),
                    Catch::Contains("ckpt-0000000019.safetensors: tensor " +
                                    model.parameter_infos()[0].name + " has shape [") &&
                        Catch::Contains("the model's is ["));
  CHECK_THROWS_AS(train_once(c, dir.path()), common::ConfigError);
}

TEST_CASE("dtrain-worker out of memory is exit 2 (a restart would not fit either)") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  WARN("skipped under sanitizers: they reserve more address space than the limit set here");
  return;
#endif
  testing::TempDir dir;
  std::string job = dir.path() + "/big.json";
  // A dense layer of 64x64 inputs and 400,000 units: 6.5 GB of weights, more than a 4 GB address
  // space, which still holds the CUDA build's libraries (cuBLAS alone maps most of 700 MB).
  std::string text = small_job(R"({"dir": "backup"})");
  text.replace(text.find("[4, 4, 1]"), 9, "[64, 64, 1]");
  const std::string layers = R"({"type": "flatten"}, {"type": "dense", "units": 3})";
  text.replace(text.find(layers), layers.size(),
               R"({"type": "flatten"}, {"type": "dense", "units": 400000},
                  {"type": "dense", "units": 3})");
  std::ofstream(job) << text;
  auto r = testing::run_process(
      {"/bin/sh", "-c", "ulimit -v 4000000 && exec \"$0\" --config \"$1\" --run-dir \"$2\"",
       testing::binary("dtrain-worker"), job, dir.path() + "/run"});
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("out of memory") != std::string::npos);
}

// Issue 46, item 3: Keras's EarlyStopping. Monitoring the training loss in "max" mode, no epoch
// after the first improves on it, so with patience 1 training stops after epoch 2 of 4, and
// restore_best_weights gives back epoch 1's weights: those of a 1-epoch run, bit for bit; a
// ModelCheckpoint with save_best_only on the same rule keeps that model in model/best/.
TEST_CASE("EarlyStopping stops after patience epochs and restores the best weights") {
  const std::string early =
      R"(, "callbacks": [{"class_name": "EarlyStopping", "config": {"monitor": "loss",
         "mode": "max", "patience": 1, "restore_best_weights": true}},
         {"type": "ModelCheckpoint", "filepath": "best.keras", "monitor": "loss", "mode": "max",
          "save_best_only": true}]})";
  std::string text = kTrain;
  text.replace(text.find("SEED"), 4, "42");
  std::string stopping = text;
  stopping.replace(stopping.rfind('}'), 1, early);
  std::string one_epoch = text;
  one_epoch.replace(one_epoch.find("\"epochs\": 4"), 11, "\"epochs\": 1");
  testing::TempDir dir;
  train::EpochMetrics last;
  std::vector<float> stopped = testing::solo_fit(train::parse_train_config(stopping, "job.json"),
                                                 dir.path() + "/a", {.last = &last});
  CHECK(last.epoch == 2);
  std::ifstream metrics(dir.path() + "/a/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  CHECK(lines == 2);
  std::vector<float> first =
      testing::solo_fit(train::parse_train_config(one_epoch, "job.json"), dir.path() + "/b");
  REQUIRE(stopped.size() == first.size());
  CHECK(std::memcmp(stopped.data(), first.data(), first.size() * sizeof(float)) == 0);
  // ModelCheckpoint(save_best_only) on the same rule kept epoch 1's model in model/best/.
  CHECK(common::read_file(dir.path() + "/a/model/best/model.safetensors") ==
        common::read_file(dir.path() + "/b/model/model.safetensors"));
  CHECK(fs::exists(dir.path() + "/a/model/best/model.json"));
}

TEST_CASE("train.callbacks takes Keras's callbacks with their keys, and names the rest") {
  auto parse = [](const std::string& callbacks, bool validation = true) {
    std::string text = kTrain;
    text.replace(text.find("SEED"), 4, "1");
    if (!validation) text.replace(text.find("\"validation\": true"), 18, "\"validation\": false");
    text.replace(text.rfind('}'), 1, ", \"callbacks\": " + callbacks + "}");
    return train::parse_train_config(text, "job.json");
  };
  train::TrainConfig c = parse(R"([{"type": "EarlyStopping", "patience": 3, "min_delta": -0.01,
    "baseline": 0.5, "start_from_epoch": 2}, {"class_name": "TerminateOnNaN", "config": {}}])");
  REQUIRE(c.callbacks.early_stopping);
  const train::EarlyStoppingSpec& e = *c.callbacks.early_stopping;
  CHECK(e.watch.monitor == "val_loss");  // Keras's default
  CHECK_FALSE(e.watch.maximize);
  CHECK(e.watch.min_delta == Approx(0.01));
  CHECK(e.patience == 3);
  CHECK(*e.watch.baseline == Approx(0.5));
  CHECK(parse(R"([{"type": "EarlyStopping", "monitor": "val_accuracy"}])")
            .callbacks.early_stopping->watch.maximize);
  train::TrainConfig best = parse(R"([{"class_name": "ModelCheckpoint", "config": {
    "filepath": "best.keras", "monitor": "val_accuracy", "save_best_only": true,
    "initial_value_threshold": 0.2}}])");
  REQUIRE(best.callbacks.model_checkpoint);
  CHECK(best.callbacks.model_checkpoint->watch.maximize);
  CHECK(*best.callbacks.model_checkpoint->watch.baseline == Approx(0.2));
  CHECK_THROWS_WITH(parse(R"([{"type": "ModelCheckpoint", "filepath": "m.keras"}])"),
                    Contains("train.callbacks[0]") && Contains("save_best_only"));
  CHECK_THROWS_WITH(parse(R"([{"type": "EarlyStopping"}])", false),
                    Contains("job.json: train.callbacks[0]") && Contains("needs validation"));
  CHECK_THROWS_WITH(parse(R"([{"type": "EarlyStopping", "monitor": "val_auc"}])"),
                    Contains("train.callbacks[0].monitor") && Contains("val_auc"));
  CHECK_THROWS_WITH(parse(R"([{"type": "EarlyStopping", "mode": "down"}])"),
                    Contains("train.callbacks[0].mode"));
  CHECK_THROWS_WITH(parse(R"([{"type": "EarlyStopping", "patience": 2, "patient": 3}])"),
                    Contains("patient"));
  train::TrainConfig plateau = parse(R"([{"class_name": "ReduceLROnPlateau", "config": {
    "monitor": "val_loss", "factor": 0.2, "patience": 5, "min_lr": 0.001, "cooldown": 1}}])");
  REQUIRE(plateau.callbacks.reduce_lr);
  CHECK(plateau.callbacks.reduce_lr->watch.min_delta == Approx(1e-4));  // Keras's default here
  CHECK(plateau.callbacks.reduce_lr->factor == Approx(0.2));
  CHECK(plateau.callbacks.reduce_lr->cooldown == 1);
  CHECK_THROWS_WITH(parse(R"([{"type": "ReduceLROnPlateau", "factor": 1.5}])"),
                    Contains("train.callbacks[0].factor") && Contains("below 1"));
  CHECK_THROWS_WITH(
      parse(R"([{"class_name": "CSVLogger", "config": {}}])"),
      Contains("train.callbacks[0]") && Contains("CSVLogger") && Contains("not supported"));
  // As Keras, only a constant rate can be reduced.
  std::string scheduled = kTrain;
  scheduled.replace(scheduled.find("SEED"), 4, "1");
  const std::string adam = R"({"type": "adam", "learning_rate": 0.01})";
  scheduled.replace(scheduled.find(adam), adam.size(),
                    R"({"type": "adam", "learning_rate": {"type": "cosine_decay",
                        "initial_learning_rate": 0.01, "decay_steps": 100}})");
  scheduled.replace(scheduled.rfind('}'), 1,
                    R"(, "callbacks": [{"type": "ReduceLROnPlateau", "monitor": "loss"}]})");
  CHECK_THROWS_WITH(train::parse_train_config(scheduled, "job.json"),
                    Contains("job.json: train.callbacks") && Contains("constant learning rate") &&
                        Contains("cosine_decay"));
}
