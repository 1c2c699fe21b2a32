// Keras's AveragePooling2D as dtrain reads it: its keys (from a job file or a Keras model file)
// and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/average_pooling2d.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

class AveragePooling2dConfig : public LayerConfig {
 public:
  explicit AveragePooling2dConfig(const PoolKeys& keys) : k_(keys) {}
  const PoolKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    return pool_output_dims(k_, in[0], where);
  }
  LayerCost cost(const std::vector<Dims>& in) const override;

 private:
  PoolKeys k_;
};

/// Parses a layer object of type "average_pooling2d"; ConfigError naming the JSON path for anything
/// wrong.
std::unique_ptr<LayerConfig> parse_average_pooling2d(const common::JsonNode& node);
/// The keys of Keras's AveragePooling2D.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_average_pooling2d();

}  // namespace dtrain::nn::layers
