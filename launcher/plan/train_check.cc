// See train_check.h.
#include "launcher/plan/train_check.h"

#include <fmt/format.h>

#include <optional>

#include "common/cpu_isa.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/gpu_count.h"
#include "launcher/plan/launch_plan.h"
#include "worker/spec/preconditions.h"
#include "worker/spec/train_config.h"

namespace dtrain::launcher {

bool trains_here(const common::JobSpec& spec) {
  if (spec.slurm) return false;
  if (spec.auto_workers > 0) return true;
  for (const auto& [type, addresses] : spec.cluster.jobs())
    for (const std::string& address : addresses)
      if (!is_local_host(common::parse_host_port(address, "cluster").host)) return false;
  return true;
}

namespace {

// Whether the workers train on GPUs, where planning can tell: "cuda" and "cpu" say so; with
// "auto" the workers train on CPUs when they all run here and no GPU is visible here, and
// otherwise each worker decides on its host (nullopt).
std::optional<bool> planned_on_gpu(const common::JobSpec& spec, const train::TrainConfig& config) {
  if (config.device == train::DeviceChoice::kCuda) return true;
  if (config.device == train::DeviceChoice::kCpu) return false;
  if (trains_here(spec) &&
      common::count_visible_gpus(common::get_env(common::kEnvCudaDevices)) == 0)
    return false;
  return std::nullopt;
}

// A mixed policy the CPU here cannot compute, for a job that trains on it: the worker would
// refuse it at start-up (worker/main.cc), naming the run's spec.json.
void check_cpu_policy(const common::JobSpec& spec, const train::TrainConfig& config,
                      std::optional<bool> on_gpu) {
  if (config.math != nn::MathMode::kBfloat16 && config.math != nn::MathMode::kFloat16) return;
  if (config.dtype_policy_fallback || on_gpu != false || !trains_here(spec)) return;
  // The worker asks oneDNN (nn::cpu_supports); this reads the same answer without it
  // (common/cpu_isa.h): bf16 products, and no float16 products on any CPU.
  const bool computes = config.math == nn::MathMode::kBfloat16 && common::cpu_has_bf16_products();
  if (!computes) throw train::cpu_policy_error(config.math, spec.source);
}

}  // namespace

void check_train_section(const common::JobSpec& spec) {
  if (!spec.command.empty() || !spec.train_json) return;
  const train::TrainConfig config = train::parse_train_config(*spec.train_json, spec.source);
  // The worker's own rules where planning knows the device (docs/design.md#preconditions).
  const std::optional<bool> on_gpu = planned_on_gpu(spec, config);
  check_cpu_policy(spec, config, on_gpu);
  if (on_gpu == true) train::check_gpu_rule(config, spec.source);
  if (on_gpu.has_value()) train::check_transport(config, *on_gpu, spec.source);
  // Elastic jobs: the GPU refusal needs "cuda"; the other rules hold on any device.
  if (spec.elastic_min_workers > 0) train::check_elastic(config, on_gpu == true, spec.source);
}

}  // namespace dtrain::launcher
