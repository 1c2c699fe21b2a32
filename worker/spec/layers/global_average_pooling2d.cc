// See global_average_pooling2d.h.
#include "worker/spec/layers/global_average_pooling2d.h"

namespace dtrain::nn::layers {

Dims GlobalAveragePooling2dConfig::output_dims(const std::vector<Dims>& in,
                                               const std::string& where) const {
  refuse_sequence(in, where, "global_average_pooling2d");
  return {in[0].c, 1, 1};
}

LayerCost GlobalAveragePooling2dConfig::cost(const std::vector<Dims>& in) const {
  LayerCost cost;
  cost.macs = static_cast<double>(in[0].size());
  return cost;
}

std::unique_ptr<LayerConfig> parse_global_average_pooling2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "keepdims"});
  if (auto n = node.find("keepdims")) n->as_bool();  // 1x1xC either way in dtrain's layout
  return std::make_unique<GlobalAveragePooling2dConfig>();
}

// Keras's GlobalAveragePooling2D.get_config() (base_global_pooling.py).
std::vector<KerasKeySpec> keras_keys_global_average_pooling2d() {
  return {{"data_format", KerasKey::kChannelsLast}, {"keepdims", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
