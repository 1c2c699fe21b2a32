// See train_check.h.
#include "launcher/plan/train_check.h"

#include <fmt/format.h>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/gpu_count.h"
#include "launcher/plan/launch_plan.h"
#include "worker/data/dataset.h"
#include "worker/data/image_folder.h"
#include "worker/nn/backend.h"
#include "worker/train/preconditions.h"
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
  const train::TrainConfig config = train::parse_train_config(*spec.train_json, spec.source);
  check_cpu_policy(spec, config);
  // The worker's own rules where the device is known before a launch
  // (docs/design.md#preconditions): "cuda" trains on a GPU; with "auto" the worker decides when it
  // starts.
  const bool on_gpu = config.device == train::DeviceChoice::kCuda;
  if (on_gpu) train::check_gpu_rule(config, spec.source);
  if (spec.elastic_min_workers > 0) train::check_elastic(config, on_gpu, spec.source);
}

std::string check_train_data(const common::JobSpec& spec) {
  if (!spec.command.empty() || !spec.train_json || !runs_here(spec)) return "";
  const train::TrainConfig config = train::parse_train_config(*spec.train_json, spec.source);
  const data::DataConfig& d = config.data;
  try {
    if (d.source == "directory") {  // decoding every image is the workers' start-up, not this
      data::ImageFolder folder = data::scan_image_folder(d.train_dir, d.class_names);
      std::string line = fmt::format("# data: {} images in {} class folders of {}",
                                     folder.files.size(), folder.class_names.size(), d.train_dir);
      if (!d.test_dir.empty() && config.validation) {
        data::ImageFolder test = data::scan_image_folder(d.test_dir, folder.class_names);
        line += fmt::format(", {} in {}", test.files.size(), d.test_dir);
      }
      return line + " (scanned, not decoded)";
    }
    auto [train, test] = data::load_data(d, config.model.data_shape(), config.validation);
    const int units = config.model.units();
    data::check_labels_below(train, units);
    data::check_labels_below(test, units);
    std::string what =
        train.is_text() ? fmt::format("{} tokens", train.token_count)
        : train.target_width > 0
            ? fmt::format("{} examples, {} target value(s) each", train.count, train.target_width)
            : fmt::format("{} examples of {} classes", train.count, train.classes);
    std::string line = fmt::format("# data: {} ({}) to train", what, d.source);
    if (config.validation)
      line += fmt::format(", {} to validate", test.is_text() ? test.token_count : test.count);
    return line;
  } catch (const common::ConfigError& e) {
    throw common::ConfigError(fmt::format("{}: train.data: {}", spec.source, e.what()));
  }
}

}  // namespace dtrain::launcher
