// Keras's MultiHeadAttention as dtrain reads it: its keys (from a job file or a Keras model
// file) and its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/multi_head_attention.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct AttentionKeys {
  int heads = 0, key_dim = 0, value_dim = 0;  ///< value_dim 0: key_dim
  bool use_bias = true, causal = false;
  float dropout = 0;
  int value() const { return value_dim > 0 ? value_dim : key_dim; }
};

class MultiHeadAttentionConfig : public LayerConfig {
 public:
  explicit MultiHeadAttentionConfig(const AttentionKeys& keys) : k_(keys) {}
  const AttentionKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  bool gpu_tested() const override { return false; }
  bool draws_randomness() const override { return k_.dropout > 0; }
  LayerCost cost(const std::vector<Dims>& in) const override;

 private:
  AttentionKeys k_;
};

/// Parses a layer object of type "multi_head_attention"; ConfigError naming the JSON path for
/// anything wrong.
std::unique_ptr<LayerConfig> parse_multi_head_attention(const common::JsonNode& node);
/// The keys of Keras's MultiHeadAttention.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_multi_head_attention();
/// How MultiHeadAttention's call arguments after its query are taken from a Keras model file.
std::vector<KerasArgSpec> keras_call_multi_head_attention();

}  // namespace dtrain::nn::layers
