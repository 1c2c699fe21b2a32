// See rescaling.h.
#include "worker/spec/layers/rescaling.h"

#include <fmt/format.h>

namespace dtrain::nn::layers {
namespace {

float finite_number(const common::JsonNode& node) {
  if (node.is_array() || node.is_object())
    node.fail(fmt::format("expected a number (dtrain has no per-channel array), found {}",
                          node.describe()));
  return static_cast<float>(node.as_number(-3.4e38, 3.4e38));
}

}  // namespace

std::unique_ptr<LayerConfig> parse_rescaling(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "scale", "offset"});
  RescalingKeys k;
  k.scale = finite_number(node.at("scale"));
  if (auto n = node.find("offset")) k.offset = finite_number(*n);
  return std::make_unique<RescalingConfig>(k);
}

// Keras's Rescaling.get_config() (keras/src/layers/preprocessing/rescaling.py).
std::vector<KerasKeySpec> keras_keys_rescaling() {
  return {{"scale", KerasKey::kRead}, {"offset", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
