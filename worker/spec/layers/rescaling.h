// Keras's Rescaling as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/rescaling.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct RescalingKeys {
  float scale = 1, offset = 0;
};

class RescalingConfig : public LayerConfig {
 public:
  explicit RescalingConfig(const RescalingKeys& keys) : k_(keys) {}
  const RescalingKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override { return in[0]; }

 private:
  RescalingKeys k_;
};

/// Parses a layer object of type "rescaling"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_rescaling(const common::JsonNode& node);
/// The keys of Keras's Rescaling.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_rescaling();

}  // namespace dtrain::nn::layers
