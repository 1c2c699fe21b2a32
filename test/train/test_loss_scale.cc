// Keras's LossScaleOptimizer in TrainStep (docs/design.md#loss-scaling), forced on in fp32 on the
// host backends: a power-of-two scale changes nothing, bit for bit; an overflowing step is skipped
// (weights, slots and the optimizer's count as they were), halving the scale; the scale grows
// after dynamic_growth_steps finite steps; the state survives a checkpoint and a stopped run
// resumes bit-exactly; train.loss_scale parses as Keras's options, with errors naming the path.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "test/support/config_error.h"
#include "test/support/temp_dir.h"
#include "test/train/solo_fit.h"
#include "worker/comm/ring_communicator.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/checkpoint.h"
#include "worker/train/loss_scale.h"
#include "worker/train/optimizer.h"
#include "worker/train/safetensors.h"
#include "worker/train/train_step.h"

using namespace dtrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using Floats = std::vector<float>;
constexpr int kBatch = 8, kClasses = 10, kExampleFloats = 8 * 8;
constexpr float kHuge = 0x1p127f;  // the largest power of two a float holds

std::string config_text(const std::string& optimizer, const std::string& extra = "") {
  return R"({"model": {"input_shape": [8, 8, 1], "layers": [
    {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"},
    {"type": "max_pooling2d", "pool_size": 2}, {"type": "flatten"},
    {"type": "dense", "units": 16, "activation": "relu"}, {"type": "dense", "units": 10}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": )" +
         optimizer + R"(,
  "data": {"source": "synthetic", "examples": 256, "classes": 10},
  "per_worker_batch_size": 16, "epochs": 2, "seed": 3, "backup": {"keep": 3})" +
         extra + "}";
}

train::TrainConfig parse(const std::string& json) {
  return train::parse_train_config(json, "job.json");
}

// A worker of one on a host backend; members are destroyed bottom-up, the step first.
struct Solo {
  std::unique_ptr<nn::Backend> backend;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<train::Optimizer> optimizer;
  comm::SoloCommunicator comm;
  std::unique_ptr<train::TrainStep> step;

  Solo(const std::string& optimizer_json, bool dnnl, const train::LossScaleSpec& scale) {
    train::TrainConfig c = parse(config_text(optimizer_json));
    backend = dnnl ? nn::make_dnnl_backend() : nn::make_reference_backend();
    model = std::make_unique<nn::Model>(c.model, *backend, kBatch);
    model->initialize(7);
    optimizer = std::make_unique<train::Optimizer>(c.optimizer, model->parameters().size(),
                                                   backend->device());
    train::StepOptions options;
    options.loss_scale = scale;
    options.virtual_size = 2;        // pieces reported, so buckets
    options.min_bucket_floats = 64;  // several of them
    step = std::make_unique<train::TrainStep>(*model, *optimizer, *backend, comm, options);
  }

  // Step `step` on its batch: images in [0, brightness), labels from the step (host memory: the
  // host device).
  /// poisoned: one pixel is NaN, so the step's gradients are not finite at any scale.
  void run(int step_number, float brightness = 1.0f, bool poisoned = false) {
    std::mt19937 rng(1000 + step_number);
    std::uniform_real_distribution<float> pixel(0.0f, brightness);
    Floats images(kBatch * kExampleFloats);
    for (float& p : images) p = pixel(rng);
    if (poisoned) images[0] = NAN;
    std::vector<int32_t> labels(kBatch);
    for (int i = 0; i < kBatch; ++i) labels[i] = static_cast<int32_t>((i * 7 + step_number) % 10);
    step->run(images.data(), labels.data(), kBatch, {1, 0, step_number}, step_number % 2);
    step->stop_agreed(0);
  }

  // The weights, then each optimizer slot.
  std::vector<Floats> state() {
    std::vector<Floats> s = {model->parameters().to_host()};
    for (auto& slot : optimizer->slots()) s.push_back(slot.second->to_host());
    return s;
  }
};

train::LossScaleSpec dynamic(float initial, int64_t growth_steps = 2000) {
  train::LossScaleSpec s;
  s.enabled = true;
  s.initial_scale = initial;
  s.growth_steps = growth_steps;
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  REQUIRE(out.good());
}

bool same_bits(const std::vector<Floats>& a, const std::vector<Floats>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

const char* const kOptimizers[] = {R"({"type": "sgd", "learning_rate": 0.05, "momentum": 0.9})",
                                   R"({"type": "adam", "learning_rate": 0.01})"};

}  // namespace

TEST_CASE("a power-of-two loss scale leaves every step's update unchanged, bit for bit") {
  for (bool dnnl : {false, true}) {
    for (const char* optimizer : kOptimizers) {
      INFO((dnnl ? "oneDNN " : "reference ") << optimizer);
      Solo plain(optimizer, dnnl, {});
      Solo scaled(optimizer, dnnl, dynamic(1024));
      Solo fixed(optimizer, dnnl, [] {
        train::LossScaleSpec s = dynamic(64);
        s.dynamic = false;
        return s;
      }());
      REQUIRE(scaled.step->buckets().size() > 1);
      for (int s = 0; s < 4; ++s) {
        plain.run(s), scaled.run(s), fixed.run(s);
        CHECK(same_bits(scaled.state(), plain.state()));
        CHECK(same_bits(fixed.state(), plain.state()));
      }
      CHECK(scaled.step->skipped_steps() == 0);
      CHECK(scaled.optimizer->iterations() == 4);
      CHECK(scaled.step->loss_scale().scale() == 1024);
      CHECK(scaled.step->loss_scale().good_steps() == 4);
      // What the optimizer read: the unscaled gradients, the plain run's exactly.
      CHECK(scaled.model->gradients().to_host() == plain.model->gradients().to_host());
    }
  }
}

TEST_CASE("a step whose scaled gradients overflow is skipped, and the scale halves") {
  for (bool dnnl : {false, true}) {
    for (const char* optimizer : kOptimizers) {
      INFO((dnnl ? "oneDNN " : "reference ") << optimizer);
      Solo solo(optimizer, dnnl, dynamic(1024));
      solo.run(0), solo.run(1);
      REQUIRE(solo.step->loss_scale().good_steps() == 2);
      std::vector<Floats> before = solo.state();
      REQUIRE(before.size() > 1);  // the slots are compared too
      // The largest scale alone does not overflow [0, 1) images' gradients; images a million
      // times brighter make the dense layers' weight gradients overflow under it.
      solo.step->set_loss_scale_state({kHuge, 2});
      solo.run(2, 1e6f);
      CHECK(solo.step->skipped_steps() == 1);
      CHECK(same_bits(solo.state(), before));
      CHECK(solo.optimizer->iterations() == 2);  // the inner optimizer did not step (Keras)
      CHECK(solo.step->loss_scale().scale() == kHuge / 2);
      CHECK(solo.step->loss_scale().good_steps() == 0);
      Floats g = solo.model->gradients().to_host();
      CHECK(std::any_of(g.begin(), g.end(), [](float x) { return !std::isfinite(x); }));
      // The next step's gradients fit: it applies, and counts from one.
      solo.run(3);
      CHECK(solo.step->skipped_steps() == 1);
      CHECK(solo.optimizer->iterations() == 3);
      CHECK(solo.step->loss_scale().scale() == kHuge / 2);
      CHECK(solo.step->loss_scale().good_steps() == 1);
      CHECK(!same_bits(solo.state(), before));
    }
  }
}

TEST_CASE("where the device decides a skip, the host's count is right once settled") {
  // The host does not wait for the flag: it counts the step, and settling takes it back, as the
  // trainer does before any checkpoint, report or broadcast.
  Solo sgd(kOptimizers[0], true, dynamic(kHuge));
  Solo adam(kOptimizers[1], true, dynamic(kHuge));
  for (Solo* solo : {&sgd, &adam}) solo->run(0, 1e6f);
  CHECK(sgd.optimizer->iterations() == 1);  // not settled yet
  CHECK(adam.optimizer->iterations() == 1);
  for (Solo* solo : {&sgd, &adam}) {
    solo->step->settle_loss_scale();
    CHECK(solo->optimizer->iterations() == 0);
    CHECK(solo->step->skipped_steps() == 1);
    CHECK(solo->step->loss_scale().scale() == kHuge / 2);
    solo->step->settle_loss_scale();  // settling twice takes nothing more back
    CHECK(solo->optimizer->iterations() == 0);
    solo->run(1);
    solo->step->settle_loss_scale();
    CHECK(solo->optimizer->iterations() == 1);
  }
}

TEST_CASE("a skipped step is as if it never ran, whatever the optimizer and schedule") {
  // The skip is decided on the device and the host learns it a step late: the step after it runs
  // at the count one lower (its rate, Adam's t) through the gate, and the one after that with
  // the host's count put right. Beside a run without scaling that never ran the step: the same
  // bits (the scale is a power of two).
  const char* const optimizers[] = {
      R"({"type": "adam", "learning_rate": {"type": "cosine_decay",
          "initial_learning_rate": 0.01, "decay_steps": 8}})",
      R"({"type": "adamw", "learning_rate": {"type": "exponential_decay",
          "initial_learning_rate": 0.01, "decay_steps": 2, "decay_rate": 0.5}})",
      R"({"type": "sgd", "momentum": 0.9, "learning_rate": {"type": "cosine_decay",
          "initial_learning_rate": 0.05, "decay_steps": 8}})",
      R"({"type": "rmsprop", "learning_rate": {"type": "cosine_decay",
          "initial_learning_rate": 0.01, "decay_steps": 8}})"};
  for (bool dnnl : {false, true}) {
    for (const char* optimizer : optimizers) {
      INFO((dnnl ? "oneDNN " : "reference ") << optimizer);
      Solo scaled(optimizer, dnnl, dynamic(1024));
      Solo plain(optimizer, dnnl, {});
      scaled.run(0), scaled.run(1);
      plain.run(0), plain.run(1);
      scaled.step->set_loss_scale_state({kHuge, 0});
      scaled.run(2, 1e6f);  // overflows: skipped
      for (int s = 3; s < 7; ++s) scaled.run(s), plain.run(s);
      CHECK(same_bits(scaled.state(), plain.state()));
      CHECK(scaled.step->skipped_steps() == 1);
      CHECK(scaled.optimizer->iterations() == 6);
      CHECK(plain.optimizer->iterations() == 6);
    }
  }
}

TEST_CASE("a fixed loss scale skips nothing, as Keras's fixed scale does") {
  train::LossScaleSpec fixed = dynamic(kHuge);
  fixed.dynamic = false;
  Solo solo(kOptimizers[0], false, fixed);
  solo.run(0);
  CHECK(solo.step->skipped_steps() == 0);
  CHECK(solo.optimizer->iterations() == 1);
  CHECK(solo.step->loss_scale().scale() == kHuge);
}

TEST_CASE("the loss scale doubles after dynamic_growth_steps finite steps in a row") {
  Solo solo(kOptimizers[1], true, dynamic(256, 3));
  std::vector<std::pair<float, int64_t>> seen;
  for (int s = 0; s < 7; ++s) {
    solo.run(s);
    seen.emplace_back(solo.step->loss_scale().scale(), solo.step->loss_scale().good_steps());
  }
  CHECK(seen == std::vector<std::pair<float, int64_t>>{
                    {256, 1}, {256, 2}, {512, 0}, {512, 1}, {512, 2}, {1024, 0}, {1024, 1}});
  CHECK(solo.step->skipped_steps() == 0);

  train::LossScale rule(dynamic(2, 2));  // the rule alone: a skip restarts the count
  CHECK(rule.update(true));
  CHECK_FALSE(rule.update(false));
  CHECK(rule.state().scale == 1);
  CHECK(rule.update(true));
  CHECK(rule.scale() == 1);
  CHECK(rule.update(true));
  CHECK(rule.scale() == 2);
  rule.set_state({0x1p127f, 1});  // doubling would overflow: the scale stays
  CHECK(rule.update(true));
  CHECK(rule.scale() == 0x1p127f);
  rule.set_state({});  // none recorded: the initial state
  CHECK(rule.state().scale == 2);
  CHECK(rule.state().good_steps == 0);
  // tf.keras's floor: a skip halves the scale to no less than 1.
  CHECK_FALSE(rule.update(false));
  CHECK(rule.scale() == 1);
  CHECK_FALSE(rule.update(false));
  CHECK(rule.scale() == 1);
  rule.set_state({0.25f, 0});
  CHECK_FALSE(rule.update(false));
  CHECK(rule.scale() == 1);
}

TEST_CASE("a scale that keeps overflowing stops halving at 1, on the device and in the host copy") {
  // Before the floor, some 150 skips in a row took the device's scale to 0, which the host read
  // back as "none recorded" and so checkpointed the initial scale instead.
  for (bool dnnl : {false, true}) {
    INFO((dnnl ? "oneDNN" : "reference"));
    Solo solo(kOptimizers[0], dnnl, dynamic(4));
    for (int s = 0; s < 6; ++s) solo.run(s, 1.0f, true);
    solo.step->settle_loss_scale();
    CHECK(solo.step->skipped_steps() == 6);
    CHECK(solo.step->loss_scale().scale() == 1);
    CHECK(solo.step->loss_scale().good_steps() == 0);
    CHECK(solo.optimizer->iterations() == 0);
  }
}

TEST_CASE("a checkpoint keeps the dynamic loss scale; one without it means none") {
  testing::TempDir dir;
  Floats w = {1, 2};
  std::vector<train::TensorView> views = {{"w", {2}, w.data(), w.size()}};
  const std::string architecture = R"({"input_shape":[1,1,2],"layers":[]})";
  train::CheckpointStore store(dir.path() + "/backup", 3);
  train::TrainingState state;
  state.global_step = 1, state.step = 1;
  store.save(state, views, architecture);
  auto loaded = store.load_latest(architecture);
  REQUIRE(loaded);
  CHECK(loaded->state.loss_scale == 0);
  CHECK(train::read_safetensors_metadata(loaded->path).count("loss_scale") == 0);

  state.global_step = 2, state.step = 2;
  state.loss_scale = 0x1p-3, state.loss_scale_good_steps = 1234;
  store.save(state, views, architecture);
  loaded = store.load_latest(architecture);
  REQUIRE(loaded);
  CHECK(loaded->state.loss_scale == 0x1p-3);
  CHECK(loaded->state.loss_scale_good_steps == 1234);
}

TEST_CASE("a run with a dynamic loss scale stopped mid-epoch resumes bit-exactly") {
  // The scale doubles every 3 steps: a resume that forgot it would end with another scale.
  // Adam: the host decides each step; SGD: the device does, and the host settles.
  const std::string optimizer = GENERATE(std::string(R"("adam")"), std::string(kOptimizers[0]));
  INFO(optimizer);
  train::TrainConfig c = parse(config_text(optimizer, R"(, "dtype_policy": "float32",
        "loss_scale": {"initial_scale": 1, "dynamic_growth_steps": 3})"));
  REQUIRE(c.loss_scale.enabled);
  c.backup.delete_on_success = false;
  testing::TempDir dir;
  std::vector<float> whole = testing::solo_fit(c, dir.path() + "/whole");
  auto final_scale = [](const std::string& run) {
    auto m = train::read_safetensors_metadata(run + "/backup/ckpt-0000000032.safetensors");
    return std::make_pair(m["loss_scale"], m["loss_scale_good_steps"]);
  };
  // 32 steps: ten doublings, two steps counted since.
  CHECK(final_scale(dir.path() + "/whole") ==
        std::make_pair(std::string("1024"), std::string("2")));

  std::string run = dir.path() + "/stopped";
  CHECK_THROWS_AS(testing::solo_fit(c, run, {.stop_after = 9}), train::Preempted);
  auto metadata = train::read_safetensors_metadata(run + "/backup/ckpt-0000000010.safetensors");
  CHECK(metadata["loss_scale"] == "8");
  CHECK(metadata["loss_scale_good_steps"] == "1");
  std::vector<float> resumed = testing::solo_fit(c, run);
  REQUIRE(resumed.size() == whole.size());
  CHECK(std::memcmp(resumed.data(), whole.data(), whole.size() * sizeof(float)) == 0);
  CHECK(final_scale(run) == final_scale(dir.path() + "/whole"));
}

TEST_CASE("train.loss_scale takes Keras's options; mixed_float16 turns a dynamic one on") {
  auto scale_of = [](const std::string& extra) {
    return parse(config_text(R"("sgd")", extra)).loss_scale;
  };
  train::LossScaleSpec s = scale_of("");
  CHECK_FALSE(s.enabled);
  s = scale_of(R"(, "dtype_policy": "mixed_bfloat16")");
  CHECK_FALSE(s.enabled);
  s = scale_of(R"(, "dtype_policy": "mixed_float16")");
  CHECK(s.enabled);
  CHECK(s.dynamic);
  CHECK(s.initial_scale == 32768);
  CHECK(s.growth_steps == 2000);
  s = scale_of(R"(, "dtype_policy": "mixed_float16", "loss_scale": 128)");
  CHECK(s.enabled);
  CHECK_FALSE(s.dynamic);
  CHECK(s.initial_scale == 128);
  s = scale_of(R"(, "loss_scale": {"initial_scale": 1e30})");
  CHECK(s.enabled);
  CHECK(s.dynamic);
  s = scale_of(R"(, "loss_scale": {"initial_scale": 1024, "dynamic_growth_steps": 10})");
  CHECK(s.dynamic);
  CHECK(s.initial_scale == 1024);
  CHECK(s.growth_steps == 10);
  // The count of finite steps is a float on the device: exact, and so allowed, up to 2^24.
  s = scale_of(R"(, "loss_scale": {"dynamic_growth_steps": 16777216})");
  CHECK(s.growth_steps == train::kMaxGrowthSteps);

  struct Bad {
    const char* value;
    const char* path;
  };
  for (const Bad& bad :
       {Bad{R"("static")", "train.loss_scale"}, Bad{"0", "train.loss_scale"},
        Bad{"-4", "train.loss_scale"}, Bad{"true", "train.loss_scale"},
        Bad{"1e39", "train.loss_scale"}, Bad{"null", "train.loss_scale"},
        Bad{R"({"scale": 2})", "train.loss_scale"},
        Bad{R"({"initial_scale": 0})", "train.loss_scale.initial_scale"},
        Bad{R"({"dynamic_growth_steps": 0})", "train.loss_scale.dynamic_growth_steps"},
        Bad{R"({"dynamic_growth_steps": 16777217})", "train.loss_scale.dynamic_growth_steps"}}) {
    INFO(bad.value);
    std::string message = testing::config_error([&] {
      scale_of(std::string(R"(, "dtype_policy": "mixed_float16", "loss_scale": )") + bad.value);
    });
    CHECK_THAT(message, Contains("job.json: " + std::string(bad.path) + ":"));
  }
}

// The job's config with data from .npy files written to dir: images (N x 8 x 8 x 1, float32,
// used as they are) and labels i % 10, for the test split too.
std::string npy_job(const std::string& dir, const Floats& images, const std::string& optimizer) {
  auto npy = [](const std::string& descr, const std::string& shape, const std::string& data) {
    std::string header =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
    header.push_back('\n');
    std::string out = std::string("\x93NUMPY") + '\x01' + '\x00';
    out.push_back(static_cast<char>(header.size() & 0xff));
    out.push_back(static_cast<char>(header.size() >> 8));
    return out + header + data;
  };
  const size_t examples = images.size() / kExampleFloats;
  std::vector<int64_t> labels(examples);
  for (size_t i = 0; i < examples; ++i) labels[i] = static_cast<int64_t>(i % 10);
  const std::string x = dir + "/x.npy", y = dir + "/y.npy", n = std::to_string(examples);
  write_file(x, npy("<f4", "(" + n + ", 8, 8, 1)",
                    std::string(reinterpret_cast<const char*>(images.data()),
                                images.size() * sizeof(float))));
  write_file(y, npy("<i8", "(" + n + ",)",
                    std::string(reinterpret_cast<const char*>(labels.data()),
                                labels.size() * sizeof(int64_t))));
  std::string text = config_text(optimizer, R"(, "loss_scale": "dynamic")");
  const std::string synthetic = R"({"source": "synthetic", "examples": 256, "classes": 10})";
  text.replace(text.find(synthetic), synthetic.size(),
               R"({"source": "npy", "train_images": ")" + x + R"(", "train_labels": ")" + y +
                   R"(", "test_images": ")" + x + R"(", "test_labels": ")" + y + R"("})");
  return text;
}

TEST_CASE("a fit whose every step overflows counts no optimizer step in its checkpoints") {
  // Images of 1e37 overflow every scaled gradient: each step is skipped and halves the scale.
  // The device decides the skips, so the trainer must settle the host's count before it saves.
  for (const char* optimizer : kOptimizers) {
    INFO(optimizer);
    testing::TempDir dir;
    train::TrainConfig c =
        parse(npy_job(dir.path(), Floats(64 * kExampleFloats, 1e37f), optimizer));
    c.backup.delete_on_success = false;
    testing::solo_fit(c, dir.path() + "/run");
    for (auto [file, steps] : {std::pair{"ckpt-0000000004", 4}, std::pair{"ckpt-0000000008", 8}}) {
      auto m =
          train::read_safetensors_metadata(dir.path() + "/run/backup/" + file + ".safetensors");
      INFO(file);
      CHECK(m["global_step"] == std::to_string(steps));
      CHECK(m["optimizer_iterations"] == "0");
      CHECK(m["loss_scale"] == std::to_string(32768 >> steps));
      CHECK(m["loss_scale_good_steps"] == "0");
    }
    // Stopped mid-epoch: the step checkpoint counts no step either.
    CHECK_THROWS_AS(testing::solo_fit(c, dir.path() + "/stopped", {.stop_after = 6}),
                    train::Preempted);
    int checkpoints = 0;
    for (const auto& entry : fs::directory_iterator(dir.path() + "/stopped/backup")) {
      if (entry.path().extension() != ".safetensors") continue;
      auto m = train::read_safetensors_metadata(entry.path().string());
      INFO(entry.path().filename().string());
      CHECK(m["optimizer_iterations"] == "0");
      CHECK(m["loss_scale"] == std::to_string(32768 >> std::stoi(m["global_step"])));
      ++checkpoints;
    }
    CHECK(checkpoints >= 2);  // epoch 1's and the stop's
  }
}

TEST_CASE("a run whose steps are skipped now and then resumes bit-exactly under a schedule") {
  // Two bright examples of 64: a batch holding either overflows and is skipped, the others
  // apply, so skips fall between applied steps. The run is stopped mid-epoch and resumed, and
  // must end as the run that never stopped: the weights, the optimizer's count and the scale.
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Floats images(64 * kExampleFloats);
  for (float& p : images) p = pixel(rng);
  for (size_t example : {5, 40})
    std::fill_n(images.begin() + static_cast<std::ptrdiff_t>(example * kExampleFloats),
                kExampleFloats, 1e37f);
  for (const char* optimizer :
       {R"({"type": "sgd", "momentum": 0.9, "learning_rate": {"type": "cosine_decay",
            "initial_learning_rate": 0.05}})",
        R"({"type": "adam", "learning_rate": {"type": "cosine_decay",
            "initial_learning_rate": 0.01}})"}) {
    INFO(optimizer);
    testing::TempDir dir;
    train::TrainConfig c = parse(npy_job(dir.path(), images, optimizer));
    c.epochs = 4;  // 16 steps
    c.backup.delete_on_success = false;
    std::vector<float> whole = testing::solo_fit(c, dir.path() + "/whole");
    auto last = [&](const std::string& run) {
      return train::read_safetensors_metadata(run + "/backup/ckpt-0000000016.safetensors");
    };
    auto w = last(dir.path() + "/whole");
    const int applied = std::stoi(w["optimizer_iterations"]);
    CHECK(applied > 2);   // steps applied
    CHECK(applied < 14);  // and steps skipped
    const std::string run = dir.path() + "/stopped";
    CHECK_THROWS_AS(testing::solo_fit(c, run, {.stop_after = 6}), train::Preempted);
    std::vector<float> resumed = testing::solo_fit(c, run);
    REQUIRE(resumed.size() == whole.size());
    CHECK(std::memcmp(resumed.data(), whole.data(), whole.size() * sizeof(float)) == 0);
    auto r = last(run);
    for (const char* key : {"optimizer_iterations", "loss_scale", "loss_scale_good_steps"}) {
      INFO(key);
      CHECK(r[key] == w[key]);
    }
  }
}
