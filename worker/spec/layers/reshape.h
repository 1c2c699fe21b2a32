// Keras's Reshape as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/reshape.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct ReshapeKeys {
  std::vector<int> target;  ///< target_shape: [units] or [height, width, channels], one -1 at most
};

class ReshapeConfig : public LayerConfig {
 public:
  explicit ReshapeConfig(ReshapeKeys keys) : k_(std::move(keys)) {}
  const ReshapeKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;

 private:
  /// target_shape as written: "[8, 8, -1]".
  std::string shape_text() const;
  ReshapeKeys k_;
};

/// Parses a layer object of type "reshape"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_reshape(const common::JsonNode& node);
/// The keys of Keras's Reshape.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_reshape();

}  // namespace dtrain::nn::layers
