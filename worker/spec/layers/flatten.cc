// See flatten.h.
#include "worker/spec/layers/flatten.h"

namespace dtrain::nn::layers {

std::unique_ptr<LayerConfig> parse_flatten(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs"});
  return std::make_unique<FlattenConfig>();
}

// Keras's Flatten.get_config() (keras/src/layers/reshaping/flatten.py).
std::vector<KerasKeySpec> keras_keys_flatten() {
  return {{"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
