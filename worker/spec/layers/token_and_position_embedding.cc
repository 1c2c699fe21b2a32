// See token_and_position_embedding.h.
#include "worker/spec/layers/token_and_position_embedding.h"

#include <fmt/format.h>

#include <string>

namespace dtrain::nn::layers {

Dims TokenAndPositionEmbeddingConfig::output_dims(const std::vector<Dims>& in,
                                                  const std::string& where) const {
  const Dims& x = in[0];
  if (!x.sequence || x.w != 1 || x.c != 1) {
    throw common::ConfigError(fmt::format(
        "{}: token_and_position_embedding takes a sequence of token ids (input_shape [T])", where));
  }
  if (x.h > k_.length) {
    throw common::ConfigError(fmt::format(
        "{}: its input has {} positions, more than its sequence_length {}", where, x.h, k_.length));
  }
  return {1, x.h, k_.dim, true};
}

std::unique_ptr<LayerConfig> parse_token_and_position_embedding(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "vocabulary_size", "sequence_length", "embedding_dim",
                   "embeddings_initializer", "tie_weights", "mask_zero"});
  TokenPositionKeys k;
  k.vocabulary = static_cast<int>(node.at("vocabulary_size").as_int(1, 1 << 24));
  k.length = static_cast<int>(node.at("sequence_length").as_int(1, 1 << 20));
  k.dim = static_cast<int>(node.at("embedding_dim").as_int(1, 1 << 20));
  if (auto n = node.find("embeddings_initializer")) k.init = parse_uniform_initializer(*n);
  if (auto n = node.find("tie_weights"); n && !n->as_bool())
    n->fail("false is not supported (it adds a reverse table dtrain does not keep): true");
  if (auto n = node.find("mask_zero"); n && n->as_bool())
    n->fail("true is not supported (dtrain has no masks): false");
  return std::make_unique<TokenAndPositionEmbeddingConfig>(k);
}

// keras_hub's TokenAndPositionEmbedding.get_config() (keras_hub/src/layers/modeling/
// token_and_position_embedding.py).
std::vector<KerasKeySpec> keras_keys_token_and_position_embedding() {
  return {{"vocabulary_size", KerasKey::kRead}, {"sequence_length", KerasKey::kRead},
          {"embedding_dim", KerasKey::kRead},   {"embeddings_initializer", KerasKey::kRead},
          {"tie_weights", KerasKey::kRead},     {"mask_zero", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
