// Training-step time of a model, run by scripts/bench-step.sh (oneDNN) and scripts/bench-gpu.sh
// (CUDA): the trainer's own step (TrainStep: staged input upload, forward, loss on the device,
// backward, optimizer; CUDA graphs where they apply) in a world of one. Prints ms/step,
// samples/s and achieved GFLOP/s at one batch size, beside the device's sgemm peak measured in
// the same run (the backend's dense layer at 1024^3). Threads come from OMP_NUM_THREADS. Prints
// one table row. Asserts nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/json.h"
#include "worker/comm/ring_communicator.h"
#include "worker/nn/random.h"
#include "worker/nn/sequential.h"
#include "worker/train/input_stager.h"
#include "worker/train/optimizer.h"
#include "worker/train/train_config.h"
#include "worker/train/train_step.h"

namespace {
using namespace dtrain;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The backend's dense layer at 1024 x 1024 x 1024 is one large sgemm: the device's practical peak.
double sgemm_peak_gflops(nn::Backend& backend) {
  const size_t n = 1024;
  nn::Device& device = backend.device();
  nn::Buffer<float> a(device, n * n), b(device, n * n), bias(device, n), c(device, n * n);
  a.from_host(std::vector<float>(n * n, 1.0f));
  b.from_host(std::vector<float>(n * n, 0.5f));
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    device.synchronize();
    auto t = Clock::now();
    backend.dense_forward(n, n, n, a.data(), b.data(), bias.data(), c.data());
    device.synchronize();
    best = std::min(best, seconds_since(t));
  }
  return 2.0 * n * n * n / best / 1e9;
}

// Multiply-adds of one training step: forward, and backward for weights (and data, except for
// the first layer, whose input gradient nobody needs).
double step_flops(const nn::ModelSpec& spec, int batch) {
  double flops = 0;
  int c = spec.channels, h = spec.height, w = spec.width;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    const nn::LayerSpec& l = spec.layers[i];
    int passes = i == 0 ? 2 : 3;
    if (l.type == nn::LayerType::kConv2d) {
      int oh =
          l.same_padding ? (h + l.stride_h - 1) / l.stride_h : (h - l.kernel_h) / l.stride_h + 1;
      int ow =
          l.same_padding ? (w + l.stride_w - 1) / l.stride_w : (w - l.kernel_w) / l.stride_w + 1;
      flops += passes * 2.0 * batch * l.filters * c * l.kernel_h * l.kernel_w * oh * ow;
      c = l.filters, h = oh, w = ow;
    } else if (l.type == nn::LayerType::kMaxPooling2d) {
      h = (h - l.pool_h) / l.stride_h + 1, w = (w - l.pool_w) / l.stride_w + 1;
    } else if (l.type == nn::LayerType::kFlatten) {
      c = c * h * w, h = w = 1;
    } else if (l.type == nn::LayerType::kDense) {
      flops += passes * 2.0 * batch * c * h * w * l.units;
      c = l.units, h = w = 1;
    }
  }
  return flops;
}

int run(int argc, char** argv) {
  if (argc < 3)
    throw common::ConfigError(
        "usage: step_bench JOB_FILE BATCH [STEPS] [cpu|cuda] [graphs|eager] "
        "[float32|tf32|mixed_bfloat16|mixed_float16]");
  std::string text = common::read_file(argv[1]);
  auto doc = common::JsonDocument::parse(text, argv[1]);
  train::TrainConfig config = train::parse_train_config(doc.root().at("train").dump(), argv[1]);
  int batch = std::stoi(argv[2]);
  int steps = argc > 3 ? std::stoi(argv[3]) : 100;
  std::string device_kind = argc > 4 ? argv[4] : "cpu";
  bool graphs = argc > 5 ? std::string(argv[5]) != "eager" : true;
  nn::MathMode math = config.math;
  if (argc > 6) {
    std::string name = argv[6];
    math = name == "tf32"             ? nn::MathMode::kTf32
           : name == "mixed_bfloat16" ? nn::MathMode::kBfloat16
           : name == "mixed_float16"  ? nn::MathMode::kFloat16
           : name == "float32"        ? nn::MathMode::kFloat32
                                      : throw common::ConfigError("step_bench: precision " + name);
  }
  auto backend = device_kind == "cuda" ? nn::make_cuda_backend(math) : nn::make_dnnl_backend();
  nn::Sequential model(config.model, *backend, batch);
  model.initialize(config.seed);
  train::Optimizer optimizer(config.optimizer, model.parameters().size(), backend->device());
  comm::SoloCommunicator solo;
  train::StepOptions options;
  options.graphs = graphs;
  train::TrainStep step(model, optimizer, *backend, solo, options);
  size_t per_example =
      static_cast<size_t>(config.model.height) * config.model.width * config.model.channels;
  train::InputStager stager(backend->device(), per_example, batch);
  std::vector<float> images(per_example * static_cast<size_t>(batch));
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (size_t i = 0; i < images.size(); ++i) images[i] = nn::unit_float(nn::random_key(1, i));
  for (int i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = i % model.classes();
  // As the trainer does: stage the next batch, then enqueue this one; read the stop flag one
  // step late.
  auto one_step = [&](int64_t s) {
    int slot = static_cast<int>(s % train::InputStager::kSlots);
    stager.ready();
    stager.stage(static_cast<int>((s + 1) % train::InputStager::kSlots), images.data(),
                 labels.data(), batch);
    step.run(stager.images(slot), stager.labels(slot), batch, {config.seed, 0, s}, slot);
    step.stop_agreed(1);
  };
  stager.stage(0, images.data(), labels.data(), batch);
  for (int i = 0; i < 10; ++i) one_step(i);  // warm-up: primitives and graphs are made here
  step.stop_agreed(0);
  auto t = Clock::now();
  for (int i = 10; i < 10 + steps; ++i) one_step(i);
  step.stop_agreed(0);
  double per_step = seconds_since(t) / steps;
  double gflops = step_flops(config.model, batch) / per_step / 1e9;
  std::printf("dtrain %d %.4f %.0f %.1f %.1f %s\n", batch, per_step * 1000, batch / per_step,
              gflops, sgemm_peak_gflops(*backend), step.graphed() ? "graph" : "eager");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return common::run_main("step_bench", [&] { return run(argc, argv); });
}
