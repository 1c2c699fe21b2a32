// Keras's ZeroPadding2D as dtrain reads it: its keys (from a job file or a Keras model file) and
// its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/zero_padding2d.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct PaddingKeys {
  int top = 1, bottom = 1, left = 1, right = 1;
};

class ZeroPadding2dConfig : public LayerConfig {
 public:
  explicit ZeroPadding2dConfig(const PaddingKeys& keys) : k_(keys) {}
  const PaddingKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;

 private:
  PaddingKeys k_;
};

/// Parses a layer object of type "zero_padding2d"; ConfigError naming the JSON path for anything
/// wrong.
std::unique_ptr<LayerConfig> parse_zero_padding2d(const common::JsonNode& node);
/// The keys of Keras's ZeroPadding2D.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_zero_padding2d();

}  // namespace dtrain::nn::layers
