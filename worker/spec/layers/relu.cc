// See relu.h.
#include "worker/spec/layers/relu.h"

namespace dtrain::nn::layers {

std::unique_ptr<LayerConfig> parse_relu(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs"});
  return std::make_unique<ReluConfig>();
}

// Keras's ReLU.get_config() (keras/src/layers/activations/relu.py): only the plain max(x, 0).
std::vector<KerasKeySpec> keras_keys_relu() {
  return {{"max_value", KerasKey::kNull},
          {"negative_slope", KerasKey::kZero},
          {"threshold", KerasKey::kZero}};
}

}  // namespace dtrain::nn::layers
