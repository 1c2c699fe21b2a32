// Keras's TokenAndPositionEmbedding (keras_hub) as dtrain reads it: its keys (from a job file or
// a Keras model file) and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/token_and_position_embedding.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct TokenPositionKeys {
  int vocabulary = 0, length = 0, dim = 0;
  UniformRange init;
};

class TokenAndPositionEmbeddingConfig : public LayerConfig {
 public:
  explicit TokenAndPositionEmbeddingConfig(const TokenPositionKeys& keys) : k_(keys) {}
  const TokenPositionKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  bool gpu_tested() const override { return false; }

 private:
  TokenPositionKeys k_;
};

/// Parses a layer object of type "token_and_position_embedding"; ConfigError naming the JSON path
/// for anything wrong.
std::unique_ptr<LayerConfig> parse_token_and_position_embedding(const common::JsonNode& node);
/// The keys of Keras's TokenAndPositionEmbedding (keras_hub).get_config() beyond Layer's own, and
/// how each is taken.
std::vector<KerasKeySpec> keras_keys_token_and_position_embedding();

}  // namespace dtrain::nn::layers
