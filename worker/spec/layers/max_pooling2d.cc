// See max_pooling2d.h.
#include "worker/spec/layers/max_pooling2d.h"

namespace dtrain::nn::layers {

std::unique_ptr<LayerConfig> parse_max_pooling2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "pool_size", "strides", "padding"});
  return std::make_unique<MaxPooling2dConfig>(parse_pool_keys(node, false));
}

// Keras's MaxPooling2D.get_config() (keras/src/layers/pooling/base_pooling.py).
std::vector<KerasKeySpec> keras_keys_max_pooling2d() {
  return {{"pool_size", KerasKey::kRead},
          {"padding", KerasKey::kRead},
          {"strides", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
