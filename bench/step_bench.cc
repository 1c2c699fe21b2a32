// Training-step time of a model, run by scripts/bench-step.sh (oneDNN) and scripts/bench-gpu.sh
// (CUDA): the trainer's own step (TrainStep: staged input upload, forward, loss on the device,
// backward, optimizer; CUDA graphs where they apply) in a world of one. Prints ms/step,
// samples/s and achieved GFLOP/s at one batch size, beside the device's sgemm peak measured in
// the same run (the backend's dense layer at 1024^3). Threads come from OMP_NUM_THREADS. Prints
// one table row; a row of "n/a" (and why, on stderr) when the CPU cannot compute in the
// precision asked for. With --profile, every backend call is timed (nn::ProfiledBackend) and a
// table of one step follows the row: data staging, each layer's forward and backward, the loss,
// the optimizer, the all-reduce wait and the rest ("other"), in ms and share of the step, with
// the CPU model and oneDNN's ISA (on a GPU: eager steps, synchronized around each call, so the
// row's step time is slower than without --profile). step_bench --cpu-info prints the CPU
// model, oneDNN's ISA and whether the CPU computes in mixed_bfloat16. With --plain-activations the
// oneDNN backend keeps every activation in plain NCHW (docs/design.md#blocked-activations: the
// step as it was before activations were blocked, for a comparison in one run). Asserts nothing.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/json.h"
#include "worker/comm/ring_communicator.h"
#include "worker/nn/model.h"
#include "worker/nn/profiled_backend.h"
#include "worker/nn/random.h"
#include "worker/spec/train_config.h"
#include "worker/train/input_stager.h"
#include "worker/train/optimizer.h"
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
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const nn::NodeSpec& node = spec.nodes[i];
    bool first = node.inputs == std::vector<size_t>{nn::NodeSpec::kModelInput};
    int passes = first ? 2 : 3;
    flops += passes * 2.0 * batch * node.config->cost(spec.input_dims_of(i)).macs;
  }
  return flops;
}

struct BenchArgs {
  std::string job_file;
  int batch = 0;
  int steps = 100;
  std::string device = "cpu";
  bool graphs = true;
  std::string precision;  ///< empty: the job's train.dtype_policy
  bool profile = false;
  bool plain_activations = false;
};

BenchArgs parse_args(int argc, char** argv) {
  std::vector<std::string> positional;
  BenchArgs args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--profile")
      args.profile = true;
    else if (arg == "--plain-activations")
      args.plain_activations = true;
    else
      positional.push_back(arg);
  }
  if (positional.size() < 2)
    throw common::ConfigError(
        "usage: step_bench JOB_FILE BATCH [STEPS] [cpu|cuda] [graphs|eager] "
        "[float32|tf32|mixed_bfloat16|mixed_float16] [--profile] [--plain-activations]\n"
        "       step_bench --cpu-info");
  args.job_file = positional[0];
  args.batch = std::stoi(positional[1]);
  if (positional.size() > 2) args.steps = std::stoi(positional[2]);
  if (positional.size() > 3) args.device = positional[3];
  if (positional.size() > 4) args.graphs = positional[4] != "eager";
  if (positional.size() > 5) args.precision = positional[5];
  return args;
}

nn::MathMode math_mode_of(const std::string& name) {
  return name == "tf32"             ? nn::MathMode::kTf32
         : name == "mixed_bfloat16" ? nn::MathMode::kBfloat16
         : name == "mixed_float16"  ? nn::MathMode::kFloat16
         : name == "float32"        ? nn::MathMode::kFloat32
                                    : throw common::ConfigError("step_bench: precision " + name);
}

// /proc/cpuinfo's first "model name", or "unknown".
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
  return "unknown";
}

// What one step's time went to, from the profiled backend's table, the staging time measured
// here and the trainer's all-reduce wait: one row per phase, then "other" (the rest of the step:
// the trainer's own work between calls) and the whole step.
struct Phases {
  double staging_seconds = 0;
  std::optional<double> wait_seconds = std::nullopt;  ///< none on a device other than the host
  double step_seconds = 0;                            ///< summed over steps
  int steps = 0;
};

void print_profile(const Phases& p, const std::vector<nn::OpTime>& ops, const std::string& where) {
  const double n = p.steps, step_ms = p.step_seconds / n * 1000;
  std::printf("# profile of one step (mean of %d): %s\n", p.steps, where.c_str());
  std::printf("ms_per_step share calls_per_step phase\n");
  auto row = [&](double seconds, double calls, const std::string& phase) {
    std::printf("%.4f %.1f%% %.0f %s\n", seconds / n * 1000, seconds / n * 1000 / step_ms * 100,
                calls / n, phase.c_str());
  };
  double measured = p.staging_seconds;
  row(p.staging_seconds, n, "data staging (InputStager::stage)");
  for (const nn::OpTime& op : ops) {
    row(op.seconds, static_cast<double>(op.calls), op.label);
    measured += op.seconds;
  }
  if (p.wait_seconds) {
    row(*p.wait_seconds, n, "all-reduce wait");
    measured += *p.wait_seconds;
  } else {
    std::printf("- - - all-reduce wait (not measured on this device; in other)\n");
  }
  row(p.step_seconds - measured, n, "other (framework: step time less the above)");
  row(p.step_seconds, n, "step");
}

// Where the profile was taken: the CPU model and oneDNN's ISA, or the GPU; precision, batch and
// threads.
std::string profile_heading(nn::Backend& backend, nn::MathMode math, int batch) {
  const char* threads = std::getenv("OMP_NUM_THREADS");
  std::string where =
      backend.device().kind() == nn::DeviceKind::kHost
          ? fmt::format("CPU {}, oneDNN ISA {}", cpu_model(), nn::cpu_isa_name())
          : fmt::format("GPU {}, eager, synchronized around each call", backend.device().name());
  return where + fmt::format(", {}, batch {}, OMP_NUM_THREADS {}", nn::math_mode_name(math), batch,
                             threads ? threads : "unset");
}

// step_bench --cpu-info: what the benchmark scripts' headers name.
void print_cpu_info() {
  std::printf("cpu_model %s\nonednn_isa %s\nmixed_bfloat16 %s\n", cpu_model().c_str(),
              nn::cpu_isa_name().c_str(),
              nn::cpu_supports(nn::MathMode::kBfloat16) ? "supported" : "unsupported");
}

// The trainer's loop around TrainStep, on one fixed batch of random inputs: stage the next
// batch, then enqueue this one, and read the stop flag one step late. Times the staging.
class StepLoop {
 public:
  StepLoop(const train::TrainConfig& config, nn::Backend& backend, int batch, bool graphs)
      : config_(config), batch_(batch) {
    model_ = std::make_unique<nn::Model>(config.model, backend, batch);
    model_->initialize(config.seed);
    optimizer_ = std::make_unique<train::Optimizer>(config.optimizer, model_->parameters().size(),
                                                    backend.device());
    train::StepOptions options;
    options.graphs = graphs;
    options.loss_scale = config.loss_scale;  // as the trainer's step: mixed_float16 scales
    step_ = std::make_unique<train::TrainStep>(*model_, *optimizer_, backend, solo_, options);
    size_t per_example =
        static_cast<size_t>(config.model.height) * config.model.width * config.model.channels;
    const int positions = model_->positions();
    stager_ = std::make_unique<train::InputStager>(backend.device(), per_example, batch, positions);
    images_.resize(per_example * static_cast<size_t>(batch));
    labels_.resize(static_cast<size_t>(batch) * positions);
    // Pixels in [0, 1), or a language model's token ids (every one below the vocabulary).
    for (size_t i = 0; i < images_.size(); ++i) {
      const float u = nn::unit_float(nn::random_key(1, i));
      images_[i] =
          config.model.sequence ? std::floor(u * static_cast<float>(model_->classes())) : u;
    }
    for (size_t i = 0; i < labels_.size(); ++i)
      labels_[i] = static_cast<int32_t>(i % static_cast<size_t>(model_->classes()));
    stager_->stage(0, images_.data(), labels_.data(), batch);
  }

  /// Steps [first, first + count), then waits for the last one.
  void run(int64_t first, int count) {
    for (int64_t s = first; s < first + count; ++s) {
      int slot = static_cast<int>(s % train::InputStager::kSlots);
      auto staged = Clock::now();
      stager_->ready();
      stager_->stage(static_cast<int>((s + 1) % train::InputStager::kSlots), images_.data(),
                     labels_.data(), batch_);
      staging_seconds_ += seconds_since(staged);
      step_->run(stager_->images(slot), stager_->labels(slot), batch_, {config_.seed, 0, s}, slot);
      step_->stop_agreed(1);
    }
    step_->stop_agreed(0);
  }

  train::TrainStep& step() { return *step_; }
  /// Seconds in InputStager's ready() and stage() since the last call; resets them.
  double take_staging_seconds() { return std::exchange(staging_seconds_, 0.0); }

 private:
  const train::TrainConfig& config_;
  int batch_ = 0;
  comm::SoloCommunicator solo_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<train::Optimizer> optimizer_;
  std::unique_ptr<train::TrainStep> step_;
  std::unique_ptr<train::InputStager> stager_;
  std::vector<float> images_;
  std::vector<int32_t> labels_;
  double staging_seconds_ = 0;
};

int run(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--cpu-info") {
    print_cpu_info();
    return 0;
  }
  BenchArgs args = parse_args(argc, argv);
  std::string text = common::read_file(args.job_file);
  auto doc = common::JsonDocument::parse(text, args.job_file);
  train::TrainConfig config =
      train::parse_train_config(doc.root().at("train").dump(), args.job_file);
  const int batch = args.batch, steps = args.steps;
  nn::MathMode math = args.precision.empty() ? config.math : math_mode_of(args.precision);
  // A precision given here is the job's dtype_policy: mixed_float16 brings Keras's dynamic loss
  // scale unless the job names one (train_config.cc, parse_math; a named one is already on).
  if (math == nn::MathMode::kFloat16) config.loss_scale.enabled = true;
  const bool cuda = args.device == "cuda";
  if (!cuda && !nn::cpu_supports(math)) {
    std::fprintf(stderr,
                 "step_bench: %s is not available on this CPU (%s, oneDNN ISA %s: "
                 "nn::cpu_supports is false): n/a\n",
                 nn::math_mode_name(math), cpu_model().c_str(), nn::cpu_isa_name().c_str());
    std::printf("dtrain %d n/a n/a n/a n/a n/a\n", batch);
    return 0;
  }
  auto backend = cuda                     ? nn::make_cuda_backend(math)
                 : args.plain_activations ? nn::make_plain_dnnl_backend(math)
                                          : nn::make_dnnl_backend(math);
  // Profiled: every backend call timed (on a GPU bracketed by synchronizations, which a captured
  // graph cannot hold: eager steps).
  std::unique_ptr<nn::ProfiledBackend> profiled;
  if (args.profile) profiled = std::make_unique<nn::ProfiledBackend>(*backend);
  StepLoop loop(config, profiled ? *profiled : *backend, batch, args.graphs && !args.profile);
  loop.run(0, 10);  // warm-up: primitives and graphs are made here
  if (profiled) profiled->reset();
  loop.take_staging_seconds();
  loop.step().take_step_times();
  auto t = Clock::now();
  loop.run(10, steps);
  double elapsed = seconds_since(t), per_step = elapsed / steps;
  double gflops = step_flops(config.model, batch) / per_step / 1e9;
  std::printf("dtrain %d %.4f %.0f %.1f %.1f %s\n", batch, per_step * 1000, batch / per_step,
              gflops, sgemm_peak_gflops(*backend), loop.step().graphed() ? "graph" : "eager");
  if (profiled) {
    Phases phases{loop.take_staging_seconds(), std::nullopt, elapsed, steps};
    if (auto times = loop.step().take_step_times()) phases.wait_seconds = times->wait_seconds;
    print_profile(phases, profiled->table(), profile_heading(*backend, math, batch));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return common::run_main("step_bench", [&] { return run(argc, argv); });
}
