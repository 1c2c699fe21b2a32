// Keras's RandomFlip as dtrain reads it: its keys (from a job file or a Keras model file) and
// its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/random_flip.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct RandomFlipKeys {
  bool horizontal = true, vertical = true;
};

class RandomFlipConfig : public LayerConfig {
 public:
  explicit RandomFlipConfig(const RandomFlipKeys& keys) : k_(keys) {}
  const RandomFlipKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  bool draws_randomness() const override { return true; }

 private:
  RandomFlipKeys k_;
};

/// Parses a layer object of type "random_flip"; ConfigError naming the JSON path for anything
/// wrong.
std::unique_ptr<LayerConfig> parse_random_flip(const common::JsonNode& node);
/// The keys of Keras's RandomFlip.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_random_flip();

}  // namespace dtrain::nn::layers
