// Keras's BatchNormalization as dtrain reads it: its keys (from a job file or a Keras model
// file) and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/batch_normalization.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct NormKeys {
  float momentum = 0.99f;
  float epsilon = 1e-3f;
  bool center = true, scale = true;
  bool synchronized = false;
};

class BatchNormalizationConfig : public LayerConfig {
 public:
  explicit BatchNormalizationConfig(const NormKeys& keys) : k_(keys) {}
  const NormKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  bool sums_over_group() const override { return k_.synchronized; }

 private:
  NormKeys k_;
};

/// Parses a layer object of type "batch_normalization"; ConfigError naming the JSON path for
/// anything wrong.
std::unique_ptr<LayerConfig> parse_batch_normalization(const common::JsonNode& node);
/// The keys of Keras's BatchNormalization.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_batch_normalization();

}  // namespace dtrain::nn::layers
