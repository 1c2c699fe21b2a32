// Keras's kernel_regularizer and bias_regularizer (L1, L2, L1L2) and its clipnorm and
// global_clipnorm (worker/train/gradient_rules.*, applied by TrainStep): Keras's formulas on
// known numbers; the penalty in the reported loss; in a ring of workers, applied once to the
// reduced gradient, so that every worker holds the same bits and a global clip bounds the
// group's step, not each worker's; and the keys' mistakes named.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "test/comm/in_process_link.h"
#include "worker/comm/membership.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/threaded_communicator.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/gradient_rules.h"
#include "worker/train/optimizer.h"
#include "worker/train/train_step.h"

using namespace dtrain;
using Floats = std::vector<float>;
using Catch::Matchers::StartsWith;

namespace {

train::OptimizerSpec optimizer_of(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "optimizer");
  return train::parse_optimizer_spec(doc.root());
}

std::string optimizer_error(const std::string& json) {
  try {
    optimizer_of(json);
  } catch (const common::ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

double norm_of(const Floats& v, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += double{v[i]} * v[i];
  return std::sqrt(sum);
}

// Two tensors: a kernel of 3 floats (L1L2 0.5, 0.25) and a bias of 2 (none).
const std::vector<nn::ParamInfo> kTensors = {{"d.kernel", {3}, 0, 3, 0.5f, 0.25f},
                                             {"d.bias", {2}, 3, 2}};

// The rules of this optimizer on w and g (host backend); g is changed, the stats returned.
Floats apply_rules(const std::string& optimizer, const Floats& w, Floats& g) {
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  train::GradientRules rules(optimizer_of(optimizer), kTensors, backend->device());
  nn::Buffer<float> wb(backend->device(), w.size()), gb(backend->device(), g.size()),
      stats(backend->device(), 4);
  wb.from_host(w);
  gb.from_host(g);
  stats.from_host(Floats{10, 0, 4, 0});  // loss sum 10 over 4 examples
  rules.apply(*backend, wb.data(), gb.data(), stats.data());
  g = gb.to_host();
  return stats.to_host();
}

// conv2d (tanh, L2 on its kernel) 6x6x1 -> 4x4x3, flatten, dense 5 (L1L2 on both), dense 4.
const char* kModel = R"({
  "model": {"input_shape": [6, 6, 1], "layers": [
    {"type": "conv2d", "filters": 3, "kernel_size": 3, "activation": "tanh",
     "kernel_regularizer": REGULARIZER},
    {"type": "flatten"},
    {"type": "dense", "units": 5, "activation": "relu",
     "kernel_regularizer": {"class_name": "L1L2", "config": {"l1": 0.001, "l2": 0.002}},
     "bias_regularizer": "l2"},
    {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": OPTIMIZER,
  "data": {"source": "synthetic", "examples": 64, "classes": 4},
  "per_worker_batch_size": 4, "epochs": 1})";
constexpr int kBatch = 4, kPixels = 36;

train::TrainConfig config(const std::string& optimizer, const std::string& regularizer) {
  std::string text = kModel;
  text.replace(text.find("REGULARIZER"), 11, regularizer);
  text.replace(text.find("OPTIMIZER"), 9, optimizer);
  return train::parse_train_config(text, "test");
}

struct Result {
  std::vector<Floats> weights;  ///< each worker's after the step
  Floats before;
  double mean_loss = 0;  ///< worker 0's epoch loss
};

Result solo_step(const train::TrainConfig& c, int shards, const Floats& images,
                 const std::vector<int32_t>& labels) {
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  nn::Model model(c.model, *backend, kBatch);
  model.initialize(7);
  train::Optimizer optimizer(c.optimizer, model.parameters().size(), backend->device());
  comm::SoloCommunicator comm;
  train::StepOptions options;
  options.min_bucket_floats = 16;
  options.virtual_size = shards;
  train::TrainStep step(model, optimizer, *backend, comm, options);
  Result result;
  result.before = model.parameters().to_host();
  std::vector<nn::Buffer<float>> x;
  std::vector<nn::Buffer<int32_t>> y;
  std::vector<train::ShardInput> inputs;
  for (int j = 0; j < shards; ++j) {
    x.emplace_back(backend->device(), kBatch * kPixels);
    x.back().from_host(images.data() + static_cast<size_t>(j) * kBatch * kPixels, kBatch * kPixels);
    y.emplace_back(backend->device(), kBatch);
    y.back().from_host(labels.data() + static_cast<size_t>(j) * kBatch, kBatch);
  }
  for (int j = 0; j < shards; ++j) inputs.push_back({x[j].data(), y[j].data(), kBatch});
  step.run_shards(comm::ShardPlan{shards, 0, shards}, inputs.data(), {1, 0, 0}, 0);
  step.stop_agreed(0);
  result.weights.push_back(model.parameters().to_host());
  result.mean_loss = step.totals().mean_loss();
  return result;
}

// One step of `workers` ring workers (threads), worker r on rows [r*b, (r+1)*b) of one batch;
// or, with `solo_shards`, one worker alone holding that many virtual shards of the batch (an
// elastic group shrunk to one member).
Result one_step(const train::TrainConfig& c, int workers, int solo_shards = 0) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> pixel(-1.0f, 1.0f);
  Floats images(static_cast<size_t>(workers) * kBatch * kPixels);
  for (float& v : images) v = pixel(rng);
  std::vector<int32_t> labels;
  for (int i = 0; i < workers * kBatch; ++i) labels.push_back(static_cast<int32_t>(rng() % 4));
  if (solo_shards > 0) return solo_step(c, solo_shards, images, labels);
  auto links = testing::make_in_process_ring(workers);
  Result result;
  result.weights.resize(static_cast<size_t>(workers));
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
      nn::Model model(c.model, *backend, kBatch);
      model.initialize(7);
      train::Optimizer optimizer(c.optimizer, model.parameters().size(), backend->device());
      comm::ThreadedCommunicator comm(std::make_unique<comm::RingCommunicator>(
          std::move(links[static_cast<size_t>(r)]), r, workers));
      train::StepOptions options;
      options.min_bucket_floats = 16;  // several buckets
      options.virtual_size = workers;
      train::TrainStep step(model, optimizer, *backend, comm, options);
      if (r == 0) result.before = model.parameters().to_host();
      nn::Buffer<float> x(backend->device(), kBatch * kPixels);
      x.from_host(images.data() + static_cast<size_t>(r) * kBatch * kPixels, x.size());
      nn::Buffer<int32_t> y(backend->device(), kBatch);
      y.from_host(labels.data() + static_cast<size_t>(r) * kBatch, y.size());
      step.run(x.data(), y.data(), kBatch, {1, 0, 0}, 0);
      step.stop_agreed(0);
      result.weights[static_cast<size_t>(r)] = model.parameters().to_host();
      if (r == 0) result.mean_loss = step.totals().mean_loss();
    });
  }
  for (std::thread& t : threads) t.join();
  return result;
}

const char* kSgd = R"({"type": "sgd", "learning_rate": 1.0})";

}  // namespace

TEST_CASE("regularizers add their gradient and penalty, as Keras's L1L2", "[gradient_rules]") {
  const Floats w = {1, -2, 0, 8, -0.5f};
  Floats g = {0.5f, 0.25f, -1, 3, 2};
  Floats stats = apply_rules(kSgd, w, g);
  // kernel: g + 0.5 sign(w) + 2 * 0.25 w; the bias has no regularizer.
  CHECK(g == Floats{0.5f + 0.5f + 0.5f, 0.25f - 0.5f - 1.0f, -1.0f, 3, 2});
  // The penalty 0.5 * (1 + 2 + 0) + 0.25 * (1 + 4 + 0) = 2.75, once per example: 10 + 4 * 2.75.
  CHECK(stats[0] == Approx(21.0f));
  CHECK(stats[2] == 4.0f);
}

TEST_CASE("clipnorm clips each tensor, global_clipnorm all of them, as Keras", "[gradient_rules]") {
  const Floats w = {0, 0, 0, 0, 0};  // no penalty's gradient
  Floats g = {3, 0, 4, 0.3f, 0.4f};  // the kernel's norm is 5, the bias's 0.5
  apply_rules(R"({"type": "sgd", "clipnorm": 1})", w, g);
  CHECK(g[0] == Approx(0.6f));
  CHECK(g[2] == Approx(0.8f));
  CHECK(g[3] == 0.3f);  // under the norm: unchanged (Keras: g * clip / max(norm, clip))
  CHECK(g[4] == 0.4f);
  g = {3, 0, 4, 0.3f, 0.4f};
  apply_rules(R"({"type": "adam", "global_clipnorm": 2.5})", w, g);
  const double scale = 2.5 / std::sqrt(25.25);
  for (size_t i : {0, 2, 3, 4}) CHECK(g[i] == Approx(Floats{3, 0, 4, 0.3f, 0.4f}[i] * scale));
  g = {3, 0, 4, 0.3f, 0.4f};
  apply_rules(R"({"type": "rmsprop", "global_clipnorm": 100})", w, g);
  CHECK(g == Floats{3, 0, 4, 0.3f, 0.4f});
}

TEST_CASE("a ring's step is regularized and clipped once, on the reduced gradient",
          "[gradient_rules]") {
  // A global clip far below the gradient's norm: the group's step (SGD at rate 1) has exactly
  // that norm, and every worker the same bits. Clipped per worker and then averaged, it would
  // be shorter.
  const char* none = "null";
  for (int workers : {1, 3}) {
    INFO(workers << " workers");
    Result r = one_step(
        config(R"({"type": "sgd", "learning_rate": 1.0, "global_clipnorm": 1e-3})", none), workers);
    for (const Floats& w : r.weights) CHECK(w == r.weights[0]);
    Floats delta(r.before.size());
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = r.weights[0][i] - r.before[i];
    CHECK(norm_of(delta, 0, delta.size()) == Approx(1e-3).epsilon(1e-3));
    // clipnorm: each tensor's step has the norm (the gradients are all larger than it).
    r = one_step(config(R"({"type": "sgd", "learning_rate": 1.0, "clipnorm": 1e-4})", none),
                 workers);
    for (const Floats& w : r.weights) CHECK(w == r.weights[0]);
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = r.weights[0][i] - r.before[i];
    const size_t ends[] = {27, 30, 30 + 48 * 5, 30 + 48 * 5 + 5, delta.size() - 4, delta.size()};
    size_t begin = 0;
    for (size_t end : ends) {
      INFO("tensor ending at " << end);
      CHECK(norm_of(delta, begin, end) == Approx(1e-4).epsilon(1e-3));
      begin = end;
    }
  }
  // The penalty's gradient, 2 * l2 * w on the conv kernel (27 weights), enters the step once.
  const std::string sgd = R"({"type": "sgd", "learning_rate": 0.5})";
  Result plain = one_step(config(sgd, none), 3);
  Result regularized = one_step(config(sgd, R"({"class_name": "L2", "config": {"l2": 0.25}})"), 3);
  for (const Floats& w : regularized.weights) CHECK(w == regularized.weights[0]);
  for (size_t i = 0; i < 27; ++i) {
    const float w0 = plain.before[i];
    CHECK(regularized.weights[0][i] - plain.weights[0][i] ==
          Approx(-0.5 * 2 * 0.25 * w0).margin(1e-6));
  }
  // The reported loss gains the penalty, computed on the weights before the step.
  double penalty = 0;
  for (size_t i = 0; i < 27; ++i) penalty += 0.25 * double{plain.before[i]} * plain.before[i];
  CHECK(regularized.mean_loss - plain.mean_loss == Approx(penalty).epsilon(1e-4));
}

TEST_CASE("clipping and regularizer keys are Keras's; mistakes are named", "[gradient_rules]") {
  CHECK(optimizer_of(R"({"type": "adamw", "clipnorm": 1.5})").clipnorm == 1.5f);
  CHECK(
      optimizer_of(R"({"type": "sgd", "global_clipnorm": 2, "clipnorm": null})").global_clipnorm ==
      2.0f);
  CHECK_THAT(optimizer_error(R"({"type": "sgd", "clipnorm": 1, "global_clipnorm": 1})"),
             StartsWith("global_clipnorm: only one of clipnorm and global_clipnorm"));
  CHECK_THAT(optimizer_error(R"({"type": "adam", "clipnorm": -1})"),
             StartsWith("clipnorm: expected a number from 0"));
  CHECK_THAT(optimizer_error(R"({"type": "adam", "clipnorm": 0})"),
             StartsWith("clipnorm: expected a norm above 0"));
  CHECK_THAT(optimizer_error(R"({"type": "adam", "clipvalue": 1})"),
             StartsWith("top level: unknown key \"clipvalue\""));
  auto model_error = [](const std::string& regularizer) {
    try {
      config(kSgd, regularizer);
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(model_error(R"("l1")") == "accepted");
  CHECK(model_error(R"({"module": "keras.regularizers", "class_name": "L1L2",
    "config": {"l1": 0.0, "l2": 0.1}, "registered_name": null})") == "accepted");
  CHECK_THAT(model_error(R"("orthogonal_regularizer")"),
             StartsWith("test: train.model.layers[0].kernel_regularizer: regularizer "
                        "orthogonal_regularizer is not supported (dtrain has L1, L2 and L1L2)"));
  CHECK_THAT(model_error(R"({"class_name": "L2", "config": {"l2": -1}})"),
             StartsWith("test: train.model.layers[0].kernel_regularizer.config.l2: expected a "
                        "number from 0"));
  CHECK_THAT(model_error(R"({"class_name": "L2", "config": {"l2": 0.1, "l1": 0.1}})"),
             StartsWith("test: train.model.layers[0].kernel_regularizer.config: unknown key "
                        "\"l1\""));
  CHECK_THAT(model_error("3"), StartsWith("test: train.model.layers[0].kernel_regularizer: "
                                          "expected a regularizer's name or object"));
}

TEST_CASE("regularized and clipped, a group's step has the same bits whatever its membership",
          "[gradient_rules]") {
  // Three virtual shards: held by three ring workers, or all by one worker (an elastic group
  // shrunk to one). The reduced gradient is the same bits either way, and so is what the rules
  // make of it.
  for (const char* optimizer : {R"({"type": "sgd", "learning_rate": 0.5, "global_clipnorm": 0.01})",
                                R"({"type": "adam", "clipnorm": 0.002})"}) {
    INFO(optimizer);
    const train::TrainConfig c = config(optimizer, R"("l2")");
    Result ring = one_step(c, 3);
    Result solo = one_step(c, 3, 3);
    for (const Floats& w : ring.weights) CHECK(w == solo.weights[0]);
    CHECK(ring.weights[0] != ring.before);
    CHECK(ring.mean_loss == Approx(solo.mean_loss).epsilon(1e-6));
  }
}

TEST_CASE("the penalty a validation's loss gains is the regularizers' on the weights",
          "[gradient_rules]") {
  const train::TrainConfig c =
      config(kSgd, R"({"class_name": "L1L2", "config": {"l1": 0.5, "l2": 0.25}})");
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  nn::Model model(c.model, *backend, kBatch);
  model.initialize(7);
  const Floats w = model.parameters().to_host();
  double want = 0;
  auto add = [&](size_t begin, size_t end, double l1, double l2) {
    for (size_t i = begin; i < end; ++i) want += l1 * std::fabs(w[i]) + l2 * double{w[i]} * w[i];
  };
  add(0, 27, 0.5, 0.25);         // the conv kernel
  add(30, 270, 0.001f, 0.002f);  // the dense kernel (L1L2)
  add(270, 275, 0, 0.01f);       // its bias ("l2": 0.01)
  CHECK(train::regularization_penalty(model) == Approx(want).epsilon(1e-9));
}
