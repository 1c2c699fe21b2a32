// Keras's MaxPooling2D as dtrain reads it: its keys (from a job file or a Keras model file) and
// its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/max_pooling2d.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

class MaxPooling2dConfig : public LayerConfig {
 public:
  explicit MaxPooling2dConfig(const PoolKeys& keys) : k_(keys) {}
  const PoolKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    return pool_output_dims(k_, in[0], where);
  }
  bool gpu_tested() const override { return !k_.same; }  // the GPU's pooling has no padding yet

 private:
  PoolKeys k_;
};

/// Parses a layer object of type "max_pooling2d"; ConfigError naming the JSON path for anything
/// wrong.
std::unique_ptr<LayerConfig> parse_max_pooling2d(const common::JsonNode& node);
/// The keys of Keras's MaxPooling2D.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_max_pooling2d();

}  // namespace dtrain::nn::layers
