// Keras's SGD (momentum, nesterov) and Adam over the model's flat parameter buffer, with their
// slots (velocity; first and second moments) in flat buffers of the same size, so a checkpoint
// saves them in one piece each. The arithmetic is the Backend's.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/json.h"
#include "worker/nn/backend.h"

namespace dtrain::train {

struct OptimizerSpec {
  std::string type = "sgd";
  nn::SgdParams sgd;
  nn::AdamParams adam;
};

/// Parses train.optimizer with Keras's defaults. Throws ConfigError naming the JSON path.
OptimizerSpec parse_optimizer_spec(const common::JsonNode& node);

class Optimizer {
 public:
  Optimizer(const OptimizerSpec& spec, size_t parameter_count);

  /// One update of parameters from gradients; counts iterations (Keras's `iterations`).
  void apply(nn::Backend& backend, std::vector<float>& parameters,
             const std::vector<float>& gradients);

  int64_t iterations() const { return iterations_; }
  void set_iterations(int64_t n) { iterations_ = n; }
  /// Named slot buffers ("sgd.velocity"; "adam.m", "adam.v"), for checkpoints.
  std::vector<std::pair<std::string, std::vector<float>*>> slots();

 private:
  OptimizerSpec spec_;
  int64_t iterations_ = 0;
  std::vector<float> first_, second_;
};

}  // namespace dtrain::train
