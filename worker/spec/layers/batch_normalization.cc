// See batch_normalization.h.
#include "worker/spec/layers/batch_normalization.h"

#include <fmt/format.h>

#include <cstdint>

namespace dtrain::nn::layers {

Dims BatchNormalizationConfig::output_dims(const std::vector<Dims>& in,
                                           const std::string& where) const {
  refuse_sequence(in, where, "batch_normalization");
  return in[0];
}

std::unique_ptr<LayerConfig> parse_batch_normalization(const common::JsonNode& node) {
  node.check_keys(
      {"type", "name", "inputs", "axis", "momentum", "epsilon", "center", "scale", "synchronized"});
  NormKeys k;
  if (auto n = node.find("axis")) {
    int64_t axis = n->is_array() && n->as_array().size() == 1 ? n->as_array()[0].as_int(-4, 3)
                                                              : n->as_int(-4, 3);
    if (axis != -1 && axis != 3)
      n->fail(fmt::format("axis {} is not supported (the channels: -1, or 3 of NHWC)", axis));
  }
  if (auto n = node.find("momentum")) k.momentum = static_cast<float>(n->as_number(0.0, 1.0));
  if (auto n = node.find("epsilon")) k.epsilon = static_cast<float>(n->as_number(1e-12, 1.0));
  if (auto n = node.find("center")) k.center = n->as_bool();
  if (auto n = node.find("scale")) k.scale = n->as_bool();
  if (auto n = node.find("synchronized")) k.synchronized = n->as_bool();
  return std::make_unique<BatchNormalizationConfig>(k);
}

// Keras's BatchNormalization.get_config(): the initializers at Keras's defaults, no regularizers
// or constraints, renorm off.
std::vector<KerasKeySpec> keras_keys_batch_normalization() {
  return {{"axis", KerasKey::kRead},
          {"momentum", KerasKey::kRead},
          {"epsilon", KerasKey::kRead},
          {"center", KerasKey::kRead},
          {"scale", KerasKey::kRead},
          {"beta_initializer", KerasKey::kZeros},
          {"gamma_initializer", KerasKey::kOnes},
          {"moving_mean_initializer", KerasKey::kZeros},
          {"moving_variance_initializer", KerasKey::kOnes},
          {"beta_regularizer", KerasKey::kNull},
          {"gamma_regularizer", KerasKey::kNull},
          {"beta_constraint", KerasKey::kNull},
          {"gamma_constraint", KerasKey::kNull},
          {"synchronized", KerasKey::kRead},
          {"renorm", KerasKey::kFalse},
          {"renorm_clipping", KerasKey::kNull},
          {"renorm_momentum", KerasKey::kUnusedNumber}};
}

}  // namespace dtrain::nn::layers
