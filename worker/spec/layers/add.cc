// See add.h.
#include "worker/spec/layers/add.h"

#include <fmt/format.h>

namespace dtrain::nn::layers {

Dims AddConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i] != in[0]) {
      throw common::ConfigError(fmt::format(
          "{}: add needs inputs of one shape; input 0 is {}x{}x{}, input {} is {}x{}x{}", where,
          in[0].h, in[0].w, in[0].c, i, in[i].h, in[i].w, in[i].c));
    }
  }
  return in[0];
}

std::unique_ptr<LayerConfig> parse_add(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs"});
  return std::make_unique<AddConfig>();
}

// Keras's Add has no config keys beyond Layer's own.
std::vector<KerasKeySpec> keras_keys_add() {
  return {};
}

}  // namespace dtrain::nn::layers
