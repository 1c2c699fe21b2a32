// Synchronized batch normalization (docs/design.md#synchronized-batch-normalization): in a ring
// of workers (threads) each normalizing its own examples, `"synchronized": true` takes the
// statistics and the backward's sums over every worker's batch, so two workers of 4 examples
// take the step one worker takes on all 8 (to a rounding), with the same bits on both workers,
// while the per-worker layer does not; an elastic job refuses it, naming the layer.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "test/comm/in_process_link.h"
#include "worker/comm/membership.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/threaded_communicator.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/preconditions.h"
#include "worker/spec/train_config.h"
#include "worker/train/optimizer.h"
#include "worker/train/train_step.h"

using namespace dtrain;
using Floats = std::vector<float>;
using Catch::Matchers::Contains;

namespace {

// A normalization of the model's input (no input gradient), one with a ReLU fused, and one
// before a residual add, each SYNC.
const char* kJob = R"({
  "model": {"input_shape": [6, 6, 2], "layers": [
    {"name": "bn_in", "type": "batch_normalization", "synchronized": SYNC},
    {"name": "c1", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
    {"name": "bn1", "type": "batch_normalization", "synchronized": SYNC, "momentum": 0.5},
    {"name": "r1", "type": "relu"},
    {"name": "c2", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
    {"name": "bn2", "type": "batch_normalization", "synchronized": SYNC, "momentum": 0.5},
    {"name": "sum", "type": "add", "inputs": ["r1", "bn2"]},
    {"type": "flatten"}, {"type": "dense", "units": 3}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "sgd", "learning_rate": 0.5},
  "data": {"source": "synthetic", "examples": 64, "classes": 3},
  "per_worker_batch_size": 4, "epochs": 1})";
constexpr int kPixels = 72;

train::TrainConfig config(bool synchronized) {
  std::string text = kJob;
  for (size_t at; (at = text.find("SYNC")) != std::string::npos;)
    text.replace(at, 4, synchronized ? "true" : "false");
  return train::parse_train_config(text, "job.json");
}

struct Batch {
  Floats images;
  std::vector<int32_t> labels;
};

Batch batch_of(int examples) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> pixel(-1.0f, 2.0f);
  Batch b{Floats(static_cast<size_t>(examples) * kPixels), {}};
  for (float& v : b.images) v = pixel(rng);
  for (int i = 0; i < examples; ++i) b.labels.push_back(static_cast<int32_t>(rng() % 3));
  return b;
}

struct Worker {
  Floats parameters, state;
};

// Two steps of one worker on rows [first, first + n) of the batch, over comm.
Worker train_steps(const train::TrainConfig& c, comm::Communicator& comm, const Batch& batch,
                   int first, int n, int workers) {
  std::unique_ptr<nn::Backend> backend = nn::make_dnnl_backend();
  nn::Model model(c.model, *backend, n);
  model.initialize(7);
  train::Optimizer optimizer(c.optimizer, model.parameters().size(), backend->device());
  train::StepOptions options;
  options.min_bucket_floats = 16;  // several buckets, started between the layers' sums
  options.virtual_size = workers;
  train::TrainStep step(model, optimizer, *backend, comm, options);
  nn::Buffer<float> x(backend->device(), static_cast<size_t>(n) * kPixels);
  x.from_host(batch.images.data() + static_cast<size_t>(first) * kPixels, x.size());
  nn::Buffer<int32_t> y(backend->device(), static_cast<size_t>(n));
  y.from_host(batch.labels.data() + first, y.size());
  for (int64_t s = 0; s < 2; ++s) {
    step.run(x.data(), y.data(), n, {1, 0, s}, 0);
    step.stop_agreed(0);
  }
  return {model.parameters().to_host(), model.state().to_host()};
}

// Two workers of 4 examples each, over an in-process ring.
std::vector<Worker> two_workers(const train::TrainConfig& c, const Batch& batch) {
  auto links = testing::make_in_process_ring(2);
  std::vector<Worker> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      comm::ThreadedCommunicator comm(
          std::make_unique<comm::RingCommunicator>(std::move(links[static_cast<size_t>(r)]), r, 2));
      out[static_cast<size_t>(r)] = train_steps(c, comm, batch, 4 * r, 4, 2);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

double worst_difference(const Floats& a, const Floats& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

}  // namespace

TEST_CASE("synchronized batch normalization: two workers take one worker's step on both batches",
          "[sync_batch_norm]") {
  const Batch batch = batch_of(8);
  comm::SoloCommunicator solo;
  const Worker alone = train_steps(config(true), solo, batch, 0, 8, 1);

  std::vector<Worker> synced = two_workers(config(true), batch);
  // Every worker holds the same bits: the sums are all-reduced in rank order.
  CHECK(synced[0].parameters == synced[1].parameters);
  CHECK(synced[0].state == synced[1].state);
  // The same statistics, gradients and step as one worker with the whole batch, but for the
  // order of the sums.
  CHECK(worst_difference(synced[0].parameters, alone.parameters) < 2e-5);
  CHECK(worst_difference(synced[0].state, alone.state) < 2e-5);

  // Per-worker statistics (MultiWorkerMirroredStrategy's replicas) are another model: the test
  // above can tell the two apart.
  std::vector<Worker> per_worker = two_workers(config(false), batch);
  CHECK(per_worker[0].parameters == per_worker[1].parameters);
  CHECK(worst_difference(per_worker[0].parameters, alone.parameters) > 1e-3);
  CHECK(worst_difference(per_worker[0].state, alone.state) > 1e-3);
}

TEST_CASE("synchronized batch normalization: an elastic job refuses it, naming the layer",
          "[sync_batch_norm]") {
  CHECK_NOTHROW(train::check_elastic(config(false), false, "job.json"));
  try {
    train::check_elastic(config(true), false, "job.json");
    FAIL("accepted");
  } catch (const common::ConfigError& e) {
    CHECK_THAT(e.what(), Contains("job.json: train.model.layers[0].synchronized: true"));
    CHECK_THAT(e.what(), Contains("\"elastic\""));
  }
}
