// Keras's shorthands in the train object (an optimizer or loss named by a string, a 2-D
// input_shape), the parsed enums, and RMSprop and AdamW end to end on the oneDNN backend: their
// slots go into step checkpoints, and a run stopped mid-epoch and resumed ends with the same
// weights, bit for bit, as one that never stopped.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "test/train/solo_fit.h"
#include "worker/comm/ring_communicator.h"
#include "worker/nn/backend.h"
#include "worker/train/checkpoint.h"
#include "worker/train/safetensors.h"
#include "worker/train/trainer.h"

using namespace dtrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A small job; OPTIMIZER, LOSS and SHAPE are replaced by each test.
std::string train_json(const std::string& optimizer, const std::string& loss = "",
                       const std::string& shape = "[6, 6, 1]", const std::string& extra = "") {
  return R"({"model": {"input_shape": )" + shape + R"(, "layers": [
      {"type": "conv2d", "filters": 3, "kernel_size": 3, "activation": "relu"},
      {"type": "flatten"}, {"type": "dropout", "rate": 0.1},
      {"type": "dense", "units": 4, "activation": "softmax"}]},
    "optimizer": )" +
         optimizer + (loss.empty() ? "" : R"(, "loss": )" + loss) + R"(,
    "data": {"source": "synthetic", "examples": 256, "classes": 4},
    "per_worker_batch_size": 16, "epochs": 2, "seed": 3,
    "backup": {"save_freq": "epoch", "keep": 3})" +
         extra + "}";
}

train::TrainConfig parse(const std::string& json) {
  return train::parse_train_config(json, "job.json");
}

}  // namespace

TEST_CASE("an optimizer named by a string takes Keras's defaults") {
  train::TrainConfig c = parse(train_json(R"("adam")"));
  CHECK(c.optimizer.type == train::OptimizerType::kAdam);
  CHECK(c.optimizer.learning_rate.initial == Approx(0.001));
  c = parse(train_json(R"("sgd")"));
  CHECK(c.optimizer.type == train::OptimizerType::kSgd);
  CHECK(c.optimizer.learning_rate.initial == Approx(0.01));
  CHECK(c.optimizer.sgd.momentum == 0.0f);
  c = parse(train_json(R"("rmsprop")"));
  CHECK(c.optimizer.type == train::OptimizerType::kRmsprop);
  CHECK(c.optimizer.learning_rate.initial == Approx(0.001));
  CHECK(c.optimizer.rmsprop.rho == Approx(0.9));
  CHECK(c.optimizer.rmsprop.momentum == 0.0f);
  CHECK(c.optimizer.rmsprop.epsilon == Approx(1e-7));
  CHECK_FALSE(c.optimizer.rmsprop.centered);
  c = parse(train_json(R"("adamw")"));
  CHECK(c.optimizer.type == train::OptimizerType::kAdamW);
  CHECK(c.optimizer.learning_rate.initial == Approx(0.001));
  CHECK(c.optimizer.adamw.weight_decay == Approx(0.004));
  CHECK(c.optimizer.adamw.beta_1 == Approx(0.9));
  CHECK(c.optimizer.adamw.beta_2 == Approx(0.999));
  CHECK(c.optimizer.adamw.epsilon == Approx(1e-7));
  CHECK_THROWS_WITH(parse(train_json(R"("adagrad")")),
                    Contains("train.optimizer: unknown optimizer \"adagrad\""));
  CHECK_THROWS_WITH(parse(train_json("3")), Contains("train.optimizer: expected an optimizer"));
}

TEST_CASE("rmsprop and adamw objects take their keys and refuse others") {
  train::TrainConfig c = parse(train_json(
      R"({"type": "rmsprop", "learning_rate": 0.01, "rho": 0.8, "momentum": 0.5,
          "centered": true, "epsilon": 1e-6})"));
  CHECK(c.optimizer.rmsprop.rho == Approx(0.8));
  CHECK(c.optimizer.rmsprop.momentum == Approx(0.5));
  CHECK(c.optimizer.rmsprop.centered);
  CHECK(c.optimizer.learning_rate.initial == Approx(0.01));
  c = parse(train_json(R"({"type": "adamw", "weight_decay": 0.01})"));
  CHECK(c.optimizer.adamw.weight_decay == Approx(0.01));
  CHECK_THROWS_WITH(parse(train_json(R"({"type": "rmsprop", "nesterov": true})")),
                    Contains("nesterov"));
  CHECK_THROWS_WITH(parse(train_json(R"({"type": "adamw", "weight_decay": 2})")),
                    Contains("train.optimizer.weight_decay"));
}

TEST_CASE("a loss named by a string means from_logits false, as in Keras") {
  train::TrainConfig c = parse(train_json(R"("adam")", R"("sparse_categorical_crossentropy")"));
  CHECK_FALSE(c.from_logits);
  // The last layer has no softmax: Keras would silently treat logits as probabilities.
  std::string logits = train_json(R"("adam")", R"("sparse_categorical_crossentropy")");
  logits.replace(logits.find(R"(, "activation": "softmax")"), 25, "");
  CHECK_THROWS_WITH(parse(logits), Contains("from_logits is false"));
  CHECK_THROWS_WITH(parse(train_json(R"("adam")", R"("mse")")), Contains("train.loss"));
}

TEST_CASE("a 2-D input_shape is [h, w, 1], and the recorded architecture says so") {
  train::TrainConfig two = parse(train_json(R"("sgd")", "", "[6, 6]"));
  train::TrainConfig three = parse(train_json(R"("sgd")", "", "[6, 6, 1]"));
  CHECK(two.model.height == 6);
  CHECK(two.model.width == 6);
  CHECK(two.model.channels == 1);
  CHECK_THAT(two.model_json, Contains(R"("input_shape":[6,6,1])"));
  CHECK(three.model_json.find(R"("input_shape":[6,6,1])") != std::string::npos);
  // [6] before a conv2d is six features (only an embedding reads token ids): a 1x1 input of six
  // channels, which its 3x3 kernel does not fit.
  CHECK_THROWS_WITH(parse(train_json(R"("sgd")", "", "[6]")),
                    Contains("train.model.layers[0]") && Contains("does not fit the 1x1 input"));
  CHECK_THROWS_WITH(parse(train_json(R"("sgd")", "", "[6, 6, 1, 1]")),
                    Contains("train.model.input_shape"));
}

TEST_CASE("a chain's layers keep their order and names; train.device parses into an enum") {
  train::TrainConfig c = parse(train_json(R"("sgd")", "", "[6, 6, 1]", R"(, "device": "cpu")"));
  REQUIRE(c.model.nodes.size() == 4);
  CHECK(c.model.nodes[0].type == "conv2d");
  CHECK(c.model.nodes[1].type == "flatten");
  CHECK(c.model.nodes[2].type == "dropout");
  CHECK(c.model.nodes[2].param_prefix == "layers.2.dropout.");
  CHECK(c.model.nodes[3].inputs == std::vector<size_t>{2});
  CHECK(c.device == train::DeviceChoice::kCpu);
  CHECK(parse(train_json(R"("sgd")")).device == train::DeviceChoice::kAuto);
  CHECK(parse(train_json(R"("sgd")", "", "[6, 6, 1]", R"(, "device": "cuda")")).device ==
        train::DeviceChoice::kCuda);
  CHECK_THROWS_WITH(parse(train_json(R"("sgd")", "", "[6, 6, 1]", R"(, "device": "tpu")")),
                    Contains("train.device"));
}

TEST_CASE("dtype_policy and allow_tf32 take Keras's and PyTorch's names into one math mode") {
  auto math = [](const std::string& extra) {
    return parse(train_json(R"("sgd")", "", "[6, 6, 1]", extra)).math;
  };
  CHECK(math("") == nn::MathMode::kFloat32);
  CHECK(math(R"(, "dtype_policy": "float32")") == nn::MathMode::kFloat32);
  CHECK(math(R"(, "allow_tf32": true)") == nn::MathMode::kTf32);
  CHECK(math(R"(, "dtype_policy": "mixed_bfloat16")") == nn::MathMode::kBfloat16);
  CHECK(math(R"(, "dtype_policy": "mixed_float16", "allow_tf32": true)") == nn::MathMode::kFloat16);
  CHECK(train::dtype_policy_name(parse(
            train_json(R"("sgd")", "", "[6, 6, 1]", R"(, "allow_tf32": true)"))) == "float32");
  CHECK(std::string(nn::math_mode_name(nn::MathMode::kBfloat16)) == "mixed_bfloat16");
  CHECK_THROWS_WITH(math(R"(, "dtype_policy": "bfloat16")"), Contains("train.dtype_policy"));
  CHECK_THROWS_WITH(math(R"(, "allow_tf32": "yes")"), Contains("train.allow_tf32"));
}

// A CPU without bf16 products is this one with oneDNN held to AVX-512 without them
// (ONEDNN_MAX_CPU_ISA, oneDNN's own dispatch limit): exit 2 naming the policy and the ISA, or
// float32 with a warning under dtype_policy_fallback. mixed_float16 has no CPU products at all.
TEST_CASE("a mixed policy on a CPU without its products: exit 2, or float32 with a warning") {
  testing::TempDir dir;
  auto run = [&](const std::string& name, const std::string& extra) {
    std::string job = dir.path() + "/" + name + ".json";
    std::ofstream(job) << R"({"job": "mixed", "workers": 1, "train": )"
                       << train_json(R"("sgd")", "", "[6, 6, 1]", R"(, "device": "cpu")" + extra)
                       << "}";
    testing::ProcessOptions options;
    options.env["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE";
    return testing::run_process(
        {testing::binary("dtrain-worker"), "--config", job, "--run-dir", dir.path() + "/" + name},
        options);
  };
  auto r = run("refused", R"(, "dtype_policy": "mixed_bfloat16")");
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("train.dtype_policy") && Contains("mixed_bfloat16") &&
                        Contains("no bf16 products") && Contains("dtype_policy_fallback"));
  CHECK_FALSE(fs::exists(dir.path() + "/refused/model"));
  // Issue 46, item 6: `dtrain validate` and `dtrain launch` refuse it before any worker starts,
  // naming the user's job file, not the run's spec.json.
  const std::string job = dir.path() + "/refused.json";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"validate", job},
        std::vector<std::string>{"launch", job, "--run-dir", dir.path() + "/launched"}}) {
    std::vector<std::string> argv = {testing::binary("dtrain")};
    argv.insert(argv.end(), args.begin(), args.end());
    testing::ProcessOptions options;
    options.env["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE";
    options.env["CUDA_VISIBLE_DEVICES"] = "";  // the CPU trains, whatever this host has
    testing::ProcessResult said = testing::run_process(argv, options);
    INFO(args[0] << ": " << said.out << said.err);
    CHECK(said.exit_code == 2);
    CHECK_THAT(said.err, Contains(job + ": train.dtype_policy: \"mixed_bfloat16\"") &&
                             Contains("no bf16 products"));
  }
  CHECK_FALSE(fs::exists(dir.path() + "/launched"));

  r = run("half", R"(, "dtype_policy": "mixed_float16")");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("mixed_float16") && Contains("no float16 products"));

  r = run("fallback", R"(, "dtype_policy": "mixed_bfloat16", "dtype_policy_fallback": "float32")");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.err, Contains("training in float32 (train.dtype_policy_fallback)"));
  // Trained in float32, so recorded as float32: nothing.
  CHECK_THAT(common::read_file(dir.path() + "/fallback/model/model.json"),
             !Contains("dtype_policy"));
  CHECK_THROWS_WITH(
      parse(train_json(R"("sgd")", "", "[6, 6, 1]", R"(, "dtype_policy_fallback": "bfloat16")")),
      Contains("train.dtype_policy_fallback"));
}

// mixed_bfloat16 on a CPU with bf16 products: a run stopped mid-epoch and resumed ends with the
// weights of one that never stopped, bit for bit; both differ from float32's (the products did
// round), and the checkpoint records the policy. Without bf16 products, the backend is refused.
TEST_CASE("mixed_bfloat16 on the CPU resumes bit-exactly and records its policy") {
  train::TrainConfig c = parse(train_json(R"({"type": "sgd", "momentum": 0.9})", "", "[6, 6, 1]",
                                          R"(, "dtype_policy": "mixed_bfloat16")"));
  c.backup.delete_on_success = false;
  if (!nn::cpu_supports(nn::MathMode::kBfloat16)) {
    WARN("this CPU (" << nn::cpu_isa_name() << ") has no bf16 products: checking the refusal");
    CHECK_THROWS_AS(nn::make_dnnl_backend(c.math), common::ConfigError);
    return;
  }
  testing::TempDir dir;
  std::vector<float> whole = testing::solo_fit(c, dir.path() + "/whole");
  train::TrainConfig f32 = c;
  f32.math = nn::MathMode::kFloat32;
  std::vector<float> plain = testing::solo_fit(f32, dir.path() + "/float32");
  REQUIRE(plain.size() == whole.size());
  CHECK(std::memcmp(plain.data(), whole.data(), whole.size() * sizeof(float)) != 0);

  std::string run = dir.path() + "/stopped";
  CHECK_THROWS_AS(testing::solo_fit(c, run, {.stop_after = 5}), train::Preempted);
  for (const auto& e : fs::directory_iterator(run + "/backup")) {
    if (e.path().extension() != ".safetensors") continue;
    CHECK(train::read_safetensors_metadata(e.path()).at("dtype_policy") == "mixed_bfloat16");
  }
  std::vector<float> resumed = testing::solo_fit(c, run);
  REQUIRE(resumed.size() == whole.size());
  CHECK(std::memcmp(resumed.data(), whole.data(), whole.size() * sizeof(float)) == 0);
}

TEST_CASE("checkpoints and the final model record a mixed policy; float32 records nothing") {
  testing::TempDir dir;
  std::vector<float> w = {1.0f, 2.0f};
  std::vector<train::TensorView> views = {{"w", {2}, w.data(), w.size()}};
  const std::string architecture = R"({"input_shape":[1,1,2],"layers":[]})";
  train::write_final_model(dir.path() + "/plain", views, architecture);
  CHECK(common::read_file(dir.path() + "/plain/model.json") == architecture + "\n");
  CHECK(train::read_safetensors_metadata(dir.path() + "/plain/model.safetensors")
            .count("dtype_policy") == 0);
  train::write_final_model(dir.path() + "/mixed", views, architecture, "mixed_bfloat16");
  std::string json = common::read_file(dir.path() + "/mixed/model.json");
  CHECK(json == R"({"dtype_policy":"mixed_bfloat16","input_shape":[1,1,2],"layers":[]})"
                "\n");
  auto metadata = train::read_safetensors_metadata(dir.path() + "/mixed/model.safetensors");
  CHECK(metadata["dtype_policy"] == "mixed_bfloat16");
  CHECK(metadata["architecture"] == architecture);  // what a resume or evaluation matches

  train::CheckpointStore store(dir.path() + "/backup", 2);
  train::TrainingState state;
  state.global_step = 1, state.step = 1;
  store.save(state, views, architecture);
  CHECK(store.load_latest(architecture)->dtype_policy == "float32");
  store.set_dtype_policy("mixed_float16");
  state.global_step = 2, state.step = 2;
  store.save(state, views, architecture);
  CHECK(store.load_latest(architecture)->dtype_policy == "mixed_float16");
}

TEST_CASE("RMSprop and AdamW slots are checkpointed and a stopped run resumes bit-exactly") {
  struct Case {
    const char* optimizer;
    std::vector<const char*> slots;
  };
  for (const Case& k : {Case{R"({"type": "rmsprop", "momentum": 0.5, "centered": true})",
                             {"rmsprop.velocity", "rmsprop.momentum", "rmsprop.average_gradient"}},
                        Case{R"({"type": "rmsprop"})", {"rmsprop.velocity"}},
                        Case{R"("adamw")", {"adamw.m", "adamw.v"}}}) {
    INFO(k.optimizer);
    train::TrainConfig c = parse(train_json(k.optimizer));
    c.backup.delete_on_success = false;
    testing::TempDir dir;
    std::vector<float> whole = testing::solo_fit(c, dir.path() + "/whole");

    std::string run = dir.path() + "/stopped";
    // 16 steps an epoch: stops in epoch 1
    CHECK_THROWS_AS(testing::solo_fit(c, run, {.stop_after = 5}), train::Preempted);
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(run + "/backup"))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    REQUIRE(files.size() == 1);
    train::SafetensorsFile saved = train::read_safetensors(files[0]);
    for (const char* slot : k.slots) {
      INFO(slot);
      CHECK(saved.tensors.count(std::string("optimizer.") + slot + ".layers.3.dense.kernel") == 1);
      CHECK(saved.tensors.count(std::string("optimizer.") + slot + ".layers.0.conv2d.bias") == 1);
    }
    CHECK(saved.tensors.size() == 4 * (1 + k.slots.size()));
    int64_t resumed_at = 0;
    std::vector<float> resumed = testing::solo_fit(c, run, {.resumed_at = &resumed_at});
    CHECK(resumed_at == 6);  // asked during step 5, agreed a step later: not a fresh start
    REQUIRE(resumed.size() == whole.size());
    CHECK(std::memcmp(resumed.data(), whole.data(), whole.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("train.metrics takes Keras's names that fit the loss, and names what does not") {
  auto with = [](const std::string& loss, const std::string& metrics) {
    return parse(train_json(R"("sgd")", loss, "[6, 6, 1]", R"(, "metrics": )" + metrics));
  };
  // The softmax output: the cross-entropies over classes.
  train::TrainConfig c = with(R"("categorical_crossentropy")",
                              R"(["acc", "categorical_accuracy", {"type":
                                   "top_k_categorical_accuracy", "k": 2}])");
  CHECK(c.companion == "accuracy");
  REQUIRE(c.metrics.size() == 1);  // the accuracies are the companion
  CHECK(c.metrics[0].name == "top_k_categorical_accuracy");
  CHECK(c.metrics[0].k == 2);
  CHECK(c.data.targets == "one_hot");
  CHECK(train::logged_metrics(c) ==
        std::vector<std::string>{"loss", "accuracy", "top_k_categorical_accuracy"});
  c = with(R"("sparse_categorical_crossentropy")", R"(["sparse_top_k_categorical_accuracy"])");
  CHECK(c.metrics.at(0).k == 5);  // Keras's default
  CHECK(c.data.targets.empty());
  auto refused = [&](const std::string& loss, const std::string& metrics) {
    try {
      with(loss, metrics);
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused(R"("sparse_categorical_crossentropy")", R"(["top_k_categorical_accuracy"])"),
             Contains("job.json: train.metrics[0]: \"top_k_categorical_accuracy\": compares "
                      "one-hot labels"));
  CHECK_THAT(refused(R"("sparse_categorical_crossentropy")", R"(["categorical_accuracy"])"),
             Contains("train.metrics[0]"));
  CHECK_THAT(refused(R"("sparse_categorical_crossentropy")", R"(["mae"])"),
             Contains("measures a regression"));
  CHECK_THAT(refused(R"("sparse_categorical_crossentropy")", R"(["accuracy", "f1"])"),
             Contains("train.metrics[1]: \"f1\": unknown metric"));
  CHECK_THAT(refused(R"("categorical_crossentropy")",
                     R"(["top_k_categorical_accuracy", "top_k_categorical_accuracy"])"),
             Contains("given twice"));
  CHECK_THAT(refused(R"("categorical_crossentropy")", R"([{"type": "accuracy", "k": 2}])"),
             Contains("train.metrics[0].k: only a top-k accuracy has k"));
  CHECK_THAT(refused(R"("mean_squared_error")", "[]"), Contains("a regression loss compares"));
  CHECK_THAT(refused(R"({"type": "mean_squared_error", "from_logits": true})", "[]"),
             Contains("from_logits"));
  CHECK_THAT(refused(R"("binary_crossentropy")", "[]"),
             Contains("binary_crossentropy scores each output on its own"));
}
