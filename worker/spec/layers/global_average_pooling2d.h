// Keras's GlobalAveragePooling2D as dtrain reads it: its keys (from a job file or a Keras model
// file) and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/global_average_pooling2d.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

class GlobalAveragePooling2dConfig : public LayerConfig {
 public:
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  LayerCost cost(const std::vector<Dims>& in) const override;
};

/// Parses a layer object of type "global_average_pooling2d"; ConfigError naming the JSON path for
/// anything wrong.
std::unique_ptr<LayerConfig> parse_global_average_pooling2d(const common::JsonNode& node);
/// The keys of Keras's GlobalAveragePooling2D.get_config() beyond Layer's own, and how each is
/// taken.
std::vector<KerasKeySpec> keras_keys_global_average_pooling2d();

}  // namespace dtrain::nn::layers
