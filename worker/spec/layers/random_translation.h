// Keras's RandomTranslation as dtrain reads it: its keys (from a job file or a Keras model file)
// and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/random_translation.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct TranslationKeys {
  float height_lower = 0, height_upper = 0, width_lower = 0, width_upper = 0;
  bool bilinear = true;
  FillMode fill = FillMode::kReflect;
  float fill_value = 0;
};

class RandomTranslationConfig : public LayerConfig {
 public:
  explicit RandomTranslationConfig(const TranslationKeys& keys) : k_(keys) {}
  const TranslationKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  bool draws_randomness() const override { return true; }

 private:
  TranslationKeys k_;
};

/// Parses a layer object of type "random_translation"; ConfigError naming the JSON path for
/// anything wrong.
std::unique_ptr<LayerConfig> parse_random_translation(const common::JsonNode& node);
/// The keys of Keras's RandomTranslation.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_random_translation();

}  // namespace dtrain::nn::layers
