// See preconditions.h.
#include "worker/spec/preconditions.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace dtrain::train {

using common::ConfigError;

void check_gpu_rule(const TrainConfig& config, const std::string& source) {
  if (const nn::NodeSpec* node = config.model.first_gpu_untested())
    throw ConfigError(fmt::format("{}: train.{}", source, nn::gpu_untested_reason(*node)));
  const char* untested = config.label_smoothing > 0 ? "train.loss.label_smoothing"
                         : config.loss != nn::Loss::kSparseCategorical ? "train.loss.type"
                         : config.optimizer.weight_decay > 0    ? "train.optimizer.weight_decay"
                         : config.optimizer.clipnorm > 0        ? "train.optimizer.clipnorm"
                         : config.optimizer.global_clipnorm > 0 ? "train.optimizer.global_clipnorm"
                                                                : nullptr;
  if (untested) {
    throw ConfigError(fmt::format(
        "{}: {} has not passed its parity test on a GPU yet, so it does not run on one (train "
        "with \"device\": \"cpu\")",
        source, untested));
  }
}

void check_transport(const TrainConfig& config, bool on_gpu, const std::string& source) {
  if (config.communication != comm::Communication::kNccl || on_gpu) return;
  throw ConfigError(
      fmt::format("{}: train.communication: \"nccl\": NCCL sums GPU memory only, and this job "
                  "trains on the CPU "
                  "(train.device): set \"ring\", \"shm\" or \"auto\"",
                  source));
}

void check_elastic(const TrainConfig& config, bool on_gpu, const std::string& source) {
  if (config.communication != comm::Communication::kAuto &&
      config.communication != comm::Communication::kRing) {
    throw ConfigError(fmt::format(
        "{}: train.communication: \"{}\" cannot hold virtual shards; an elastic job (\"elastic\" "
        "in the job file) trains over the TCP ring: set \"ring\" or \"auto\"",
        source, comm::communication_name(config.communication)));
  }
  if (on_gpu) {
    throw ConfigError(fmt::format(
        "{}: an elastic job (\"elastic\" in the job file) trains on CPUs only for now; set "
        "train.device to \"cpu\"",
        source));
  }
  if (config.data.shard_policy == "file") {
    throw ConfigError(fmt::format(
        "{}: train.data.shard_policy: \"file\" gives each worker only its files, but in an elastic "
        "job a member computes the shards of the missing ones: use \"data\"",
        source));
  }
  if (const nn::NodeSpec* node = config.model.first_group_node()) {
    throw ConfigError(fmt::format(
        "{}: train.{}.synchronized: true takes the statistics over every worker's batch in step, "
        "which an elastic job (\"elastic\" in the job file) cannot do when a member holds the "
        "shards of missing ones: set \"synchronized\": false, or drop \"elastic\"",
        source, node->path));
  }
}

}  // namespace dtrain::train
