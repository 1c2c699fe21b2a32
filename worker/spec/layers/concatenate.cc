// See concatenate.h.
#include "worker/spec/layers/concatenate.h"

#include <fmt/format.h>

#include <cstdint>

namespace dtrain::nn::layers {

Dims ConcatenateConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  refuse_sequence(in, where, "concatenate");
  Dims out = in[0];
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].h != in[0].h || in[i].w != in[0].w) {
      throw common::ConfigError(fmt::format(
          "{}: concatenate needs inputs of one height and width; input 0 is {}x{}x{}, input {} "
          "is {}x{}x{}",
          where, in[0].h, in[0].w, in[0].c, i, in[i].h, in[i].w, in[i].c));
    }
    out.c += in[i].c;
  }
  return out;
}

std::unique_ptr<LayerConfig> parse_concatenate(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "axis"});
  if (auto n = node.find("axis")) {
    int64_t axis = n->as_int(-4, 3);
    if (axis != -1 && axis != 3)
      n->fail(fmt::format("axis {} is not supported (the channels: -1, or 3 of NHWC)", axis));
  }
  return std::make_unique<ConcatenateConfig>();
}

// Keras's Concatenate.get_config() (keras/src/layers/merging/concatenate.py).
std::vector<KerasKeySpec> keras_keys_concatenate() {
  return {{"axis", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
