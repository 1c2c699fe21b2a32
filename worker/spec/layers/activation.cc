// See activation.h.
#include "worker/spec/layers/activation.h"

namespace dtrain::nn::layers {

std::unique_ptr<LayerConfig> parse_activation_layer(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "activation"});
  return std::make_unique<ActivationConfig>(
      ActivationKeys{parse_activation(node.at("activation"))});
}

// Keras's Activation.get_config() (keras/src/layers/activations/activation.py).
std::vector<KerasKeySpec> keras_keys_activation() {
  return {{"activation", KerasKey::kActivation}};
}

}  // namespace dtrain::nn::layers
