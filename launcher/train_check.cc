// See train_check.h.
#include "launcher/train_check.h"

#include "common/env_vars.h"
#include "common/gpu_count.h"
#include "launcher/launch_plan.h"
#include "worker/nn/backend.h"
#include "worker/train/train_config.h"

namespace dtrain::launcher {
namespace {

// Every task on this host (no Slurm, no other host): the CPU here is the one that trains.
bool runs_here(const common::JobSpec& spec) {
  if (spec.slurm) return false;
  if (spec.auto_workers > 0) return true;
  for (const auto& [type, addresses] : spec.cluster.jobs())
    for (const std::string& address : addresses)
      if (!is_local_host(common::parse_host_port(address, "cluster").host)) return false;
  return true;
}

// A mixed policy the CPU here cannot compute, for a job that trains on it (no GPU to take it):
// the worker would refuse it at start-up (worker/main.cc), naming the run's spec.json.
void check_cpu_policy(const common::JobSpec& spec, const train::TrainConfig& config) {
  if (config.math != nn::MathMode::kBfloat16 && config.math != nn::MathMode::kFloat16) return;
  if (config.dtype_policy_fallback || config.device == train::DeviceChoice::kCuda) return;
  if (!runs_here(spec)) return;
  if (config.device == train::DeviceChoice::kAuto &&
      common::count_visible_gpus(common::get_env(common::kEnvCudaDevices)) > 0)
    return;  // the worker decides between the GPU and the CPU
  if (!nn::cpu_supports(config.math)) throw train::cpu_policy_error(config.math, spec.source);
}

}  // namespace

void check_train_section(const common::JobSpec& spec) {
  if (!spec.command.empty() || !spec.train_json) return;
  check_cpu_policy(spec, train::parse_train_config(*spec.train_json, spec.source));
}

}  // namespace dtrain::launcher
