// dtrain-worker: reads TF_CONFIG and the training config, finds its place in the group, trains.
// This is the table of contents; each step lives in its own file.
#include <spdlog/spdlog.h>

#include <iostream>

#include "common/atomic_file.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/tf_config.h"
#include "common/version.h"
#include "worker/gpu/gpu_info.h"
#include "worker/worker_options.h"

namespace dtrain::train {
namespace {

using common::ConfigError;

// The task this process plays: TF_CONFIG's, or a lone worker 0 when TF_CONFIG is unset.
common::TfConfig read_task() {
  std::optional<std::string> text = common::get_env(common::kEnvTfConfig);
  if (!text || text->empty()) {
    return common::TfConfig{common::ClusterSpec({{common::kWorker, {"localhost:0"}}}),
                            common::TaskId{common::kWorker, 0}, "", ""};
  }
  common::TfConfig config = common::parse_tf_config(*text);
  if (config.task.type == common::kPs) {
    throw ConfigError(
        "TF_CONFIG: task.type: \"ps\" (parameter server) tasks are not supported; "
        "dtrain trains with synchronous all-reduce (MultiWorkerMirroredStrategy)");
  }
  return config;
}

// The `train` object: the file's "train" member if it is a job file, else the whole file.
std::string read_train_config(const std::string& path) {
  if (path.empty()) throw ConfigError("--config is required (a job file or a train object)");
  std::string text;
  try {
    text = common::read_file(path);
  } catch (const common::IoError& e) {
    throw ConfigError(fmt::format("--config: {}", e.what()));
  }
  common::JsonDocument doc = common::JsonDocument::parse(text, path);
  common::JsonNode root = doc.root();
  if (!root.is_object())
    throw ConfigError(
        fmt::format("{}: top level: expected an object, found {}", path, root.describe()));
  if (auto train = root.find("train")) {
    if (!train->is_object())
      throw ConfigError(
          fmt::format("{}: train: expected an object, found {}", path, train->describe()));
    return train->dump();
  }
  return root.dump();
}

int run_worker(const WorkerOptions& options) {
  if (options.help) {
    std::cout << worker_usage();
    return common::kExitSuccess;
  }
  if (options.version) {
    std::cout << "dtrain-worker " << DTRAIN_VERSION << "\n";
    return common::kExitSuccess;
  }
  if (options.print_gpu) {
    std::cout << gpu::describe(gpu::probe_gpu()) << "\n";
    return common::kExitSuccess;
  }
  common::TfConfig task = read_task();
  common::setup_logging(common::role_name(task.task.type, task.task.index));
  std::string train_json = read_train_config(options.config_path);
  std::optional<int> rank = task.cluster.ring_rank(task.task);
  spdlog::info("task {} ({}), ring rank {} of {}, attempt {}", task.task.text(),
               task.cluster.is_chief(task.task) ? "chief" : "not chief",
               rank ? std::to_string(*rank) : "-", task.cluster.ring_size(),
               common::get_env_or_default(common::kEnvAttempt));
  spdlog::info("device: {}", gpu::describe(gpu::probe_gpu()));
  spdlog::info("training config: {} bytes of JSON", train_json.size());
  spdlog::error(
      "the training engine is not built yet: dtrain-worker validated its TF_CONFIG "
      "and config and stops here without training");
  return common::kExitFailure;
}

}  // namespace
}  // namespace dtrain::train

int main(int argc, char** argv) {
  return dtrain::common::run_main("dtrain-worker", [&] {
    std::vector<std::string> args(argv + 1, argv + argc);
    return dtrain::train::run_worker(dtrain::train::parse_worker_options(args));
  });
}
