// See dropout.h.
#include "worker/spec/layers/dropout.h"

namespace dtrain::nn::layers {

std::unique_ptr<LayerConfig> parse_dropout(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "rate"});
  return std::make_unique<DropoutConfig>(
      DropoutKeys{static_cast<float>(node.at("rate").as_number(0.0, 0.999))});
}

// Keras's Dropout.get_config() (keras/src/layers/regularization/dropout.py): its seed is not
// used, the mask is drawn from train.seed as above.
std::vector<KerasKeySpec> keras_keys_dropout() {
  return {{"rate", KerasKey::kRead}, {"seed", KerasKey::kSeed}, {"noise_shape", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
