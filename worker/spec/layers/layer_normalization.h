// Keras's LayerNormalization as dtrain reads it: its keys (from a job file or a Keras model
// file) and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/layer_normalization.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct LayerNormKeys {
  int axis = -1;  ///< -1, or the last axis's index in Keras's shape (checked against the input)
  float epsilon = 1e-3f;
  bool center = true, scale = true;
};

class LayerNormalizationConfig : public LayerConfig {
 public:
  explicit LayerNormalizationConfig(const LayerNormKeys& keys) : k_(keys) {}
  const LayerNormKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;

 private:
  LayerNormKeys k_;
};

/// Parses a layer object of type "layer_normalization"; ConfigError naming the JSON path for
/// anything wrong.
std::unique_ptr<LayerConfig> parse_layer_normalization(const common::JsonNode& node);
/// The keys of Keras's LayerNormalization.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_layer_normalization();

}  // namespace dtrain::nn::layers
