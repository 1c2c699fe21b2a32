// Keras's Embedding as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/embedding.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct EmbeddingKeys {
  int input_dim = 0, output_dim = 0;
  UniformRange init;
};

class EmbeddingConfig : public LayerConfig {
 public:
  explicit EmbeddingConfig(const EmbeddingKeys& keys) : k_(keys) {}
  const EmbeddingKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;

 private:
  EmbeddingKeys k_;
};

/// Parses a layer object of type "embedding"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_embedding(const common::JsonNode& node);
/// The keys of Keras's Embedding.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_embedding();

}  // namespace dtrain::nn::layers
