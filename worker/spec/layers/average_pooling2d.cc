// See average_pooling2d.h.
#include "worker/spec/layers/average_pooling2d.h"

namespace dtrain::nn::layers {

LayerCost AveragePooling2dConfig::cost(const std::vector<Dims>& in) const {
  LayerCost cost;
  cost.macs = static_cast<double>(pool_output_dims(k_, in[0], "").size()) * k_.pool_h * k_.pool_w;
  return cost;
}

std::unique_ptr<LayerConfig> parse_average_pooling2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "pool_size", "strides", "padding"});
  return std::make_unique<AveragePooling2dConfig>(parse_pool_keys(node, true));
}

// Keras's AveragePooling2D.get_config() (keras/src/layers/pooling/base_pooling.py).
std::vector<KerasKeySpec> keras_keys_average_pooling2d() {
  return {{"pool_size", KerasKey::kRead},
          {"padding", KerasKey::kRead},
          {"strides", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
