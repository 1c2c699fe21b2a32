// See layer_normalization.h.
#include "worker/spec/layers/layer_normalization.h"

#include <fmt/format.h>

#include <string>

namespace dtrain::nn::layers {

Dims LayerNormalizationConfig::output_dims(const std::vector<Dims>& in,
                                           const std::string& where) const {
  const Dims& x = in[0];
  if (!x.sequence && !x.flat()) {
    throw common::ConfigError(fmt::format(
        "{}: layer_normalization takes a sequence or flat features, not a {}x{}x{} image", where,
        x.h, x.w, x.c));
  }
  const int last = x.sequence ? 2 : 1;  // Keras's shape: (batch, T, D) or (batch, features)
  if (k_.axis != -1 && k_.axis != last) {
    throw common::ConfigError(fmt::format(
        "{}: axis {} is not supported (dtrain normalizes the last axis: -1, or {} here)", where,
        k_.axis, last));
  }
  return x;
}

std::unique_ptr<LayerConfig> parse_layer_normalization(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "axis", "epsilon", "center", "scale", "rms_scaling"});
  LayerNormKeys k;
  if (auto n = node.find("axis")) {
    // Keras writes the axes it built with as a list of positive indices ([2] for (T, D)).
    if (n->is_array() && n->as_array().size() != 1)
      n->fail("only one axis is supported (the last: -1)");
    const common::JsonNode axis = n->is_array() ? n->as_array()[0] : *n;
    k.axis = static_cast<int>(axis.as_int(-8, 8));
    if (k.axis != -1 && k.axis < 1)
      n->fail(
          fmt::format("axis {} is not supported (dtrain normalizes the last axis: -1)", k.axis));
  }
  if (auto n = node.find("epsilon")) k.epsilon = static_cast<float>(n->as_number(1e-12, 1.0));
  if (auto n = node.find("center")) k.center = n->as_bool();
  if (auto n = node.find("scale")) k.scale = n->as_bool();
  if (auto n = node.find("rms_scaling"); n && n->as_bool())
    n->fail("true is not supported (Keras deprecates it for RMSNormalization): false");
  return std::make_unique<LayerNormalizationConfig>(k);
}

// Keras's LayerNormalization.get_config() (keras/src/layers/normalization/
// layer_normalization.py): the initializers at Keras's defaults, no regularizers or constraints.
std::vector<KerasKeySpec> keras_keys_layer_normalization() {
  return {{"axis", KerasKey::kRead},
          {"epsilon", KerasKey::kRead},
          {"center", KerasKey::kRead},
          {"scale", KerasKey::kRead},
          {"rms_scaling", KerasKey::kRead},
          {"beta_initializer", KerasKey::kZeros},
          {"gamma_initializer", KerasKey::kOnes},
          {"beta_regularizer", KerasKey::kNull},
          {"gamma_regularizer", KerasKey::kNull},
          {"beta_constraint", KerasKey::kNull},
          {"gamma_constraint", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
