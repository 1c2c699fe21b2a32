// Keras's Activation as dtrain reads it: its keys (from a job file or a Keras model file) and
// its shape rules. The layer that runs, and what it computes, is worker/nn/layers/activation.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct ActivationKeys {
  Activation activation = Activation::kLinear;
};

class ActivationConfig : public LayerConfig {
 public:
  explicit ActivationConfig(const ActivationKeys& keys) : k_(keys) {}
  const ActivationKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override { return in[0]; }
  Activation activation() const override { return k_.activation; }

 private:
  ActivationKeys k_;
};

/// Parses a layer object of type "activation"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_activation_layer(const common::JsonNode& node);
/// The keys of Keras's Activation.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_activation();

}  // namespace dtrain::nn::layers
