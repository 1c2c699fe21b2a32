// Keras's PositionEmbedding (keras_hub) as dtrain reads it: its keys (from a job file or a Keras
// model file) and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/position_embedding.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct PositionEmbeddingKeys {
  int length = 0;  ///< sequence_length: the table's rows
  Initializer init = Initializer::kGlorotUniform;
};

class PositionEmbeddingConfig : public LayerConfig {
 public:
  explicit PositionEmbeddingConfig(const PositionEmbeddingKeys& keys) : k_(keys) {}
  const PositionEmbeddingKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  bool gpu_tested() const override { return false; }

 private:
  PositionEmbeddingKeys k_;
};

/// Parses a layer object of type "position_embedding"; ConfigError naming the JSON path for
/// anything wrong.
std::unique_ptr<LayerConfig> parse_position_embedding(const common::JsonNode& node);
/// The keys of Keras's PositionEmbedding (keras_hub).get_config() beyond Layer's own, and how each
/// is taken.
std::vector<KerasKeySpec> keras_keys_position_embedding();

}  // namespace dtrain::nn::layers
