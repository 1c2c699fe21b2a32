// Keras's Dropout as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/dropout.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct DropoutKeys {
  float rate = 0;
};

class DropoutConfig : public LayerConfig {
 public:
  explicit DropoutConfig(const DropoutKeys& keys) : k_(keys) {}
  const DropoutKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override { return in[0]; }
  bool draws_randomness() const override { return true; }

 private:
  DropoutKeys k_;
};

/// Parses a layer object of type "dropout"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_dropout(const common::JsonNode& node);
/// The keys of Keras's Dropout.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_dropout();

}  // namespace dtrain::nn::layers
