// Keras's Flatten as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/flatten.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

class FlattenConfig : public LayerConfig {
 public:
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override {
    return {static_cast<int>(in[0].size()), 1, 1};
  }
};

/// Parses a layer object of type "flatten"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_flatten(const common::JsonNode& node);
/// The keys of Keras's Flatten.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_flatten();

}  // namespace dtrain::nn::layers
