// Keras's ReLU as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/relu.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

class ReluConfig : public LayerConfig {
 public:
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override { return in[0]; }
  Activation activation() const override { return Activation::kRelu; }
};

/// Parses a layer object of type "relu"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_relu(const common::JsonNode& node);
/// The keys of Keras's ReLU.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_relu();

}  // namespace dtrain::nn::layers
