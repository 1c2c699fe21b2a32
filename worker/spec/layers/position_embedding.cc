// See position_embedding.h.
#include "worker/spec/layers/position_embedding.h"

#include <fmt/format.h>

#include <string>

namespace dtrain::nn::layers {

Dims PositionEmbeddingConfig::output_dims(const std::vector<Dims>& in,
                                          const std::string& where) const {
  const Dims& x = in[0];
  if (!x.sequence || x.c != 1) {
    throw common::ConfigError(fmt::format(
        "{}: position_embedding takes a sequence (positions x features), not a {}x{}x{} input",
        where, x.h, x.w, x.c));
  }
  if (x.h > k_.length) {
    throw common::ConfigError(fmt::format(
        "{}: its input has {} positions, more than its sequence_length {}", where, x.h, k_.length));
  }
  return x;
}

std::unique_ptr<LayerConfig> parse_position_embedding(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "sequence_length", "initializer"});
  PositionEmbeddingKeys k;
  k.length = static_cast<int>(node.at("sequence_length").as_int(1, 1 << 20));
  if (auto n = node.find("initializer")) k.init = parse_initializer(*n);
  return std::make_unique<PositionEmbeddingConfig>(k);
}

// keras_hub's PositionEmbedding.get_config() (keras_hub/src/layers/modeling/
// position_embedding.py).
std::vector<KerasKeySpec> keras_keys_position_embedding() {
  return {{"sequence_length", KerasKey::kRead}, {"initializer", KerasKey::kInitializer}};
}

}  // namespace dtrain::nn::layers
