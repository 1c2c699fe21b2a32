// See embedding.h.
#include "worker/spec/layers/embedding.h"

#include <fmt/format.h>

#include <string>

namespace dtrain::nn::layers {

Dims EmbeddingConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  const Dims& x = in[0];
  if (!x.sequence || x.w != 1 || x.c != 1) {
    throw common::ConfigError(
        fmt::format("{}: embedding takes a sequence of token ids (input_shape [T]), not {}", where,
                    x.sequence ? fmt::format("a sequence of {} positions of {} features", x.h, x.w)
                               : fmt::format("a {}x{}x{} input", x.h, x.w, x.c)));
  }
  return {1, x.h, k_.output_dim, true};
}

std::unique_ptr<LayerConfig> parse_embedding(const common::JsonNode& node) {
  node.check_keys(
      {"type", "name", "inputs", "input_dim", "output_dim", "embeddings_initializer", "mask_zero"});
  EmbeddingKeys k;
  // Ids travel as floats: every integer below 2^24 is exact.
  k.input_dim = static_cast<int>(node.at("input_dim").as_int(1, 1 << 24));
  k.output_dim = static_cast<int>(node.at("output_dim").as_int(1, 1 << 20));
  if (auto n = node.find("embeddings_initializer")) k.init = parse_uniform_initializer(*n);
  if (auto n = node.find("mask_zero"); n && n->as_bool())
    n->fail("true is not supported (dtrain has no masks): false");
  return std::make_unique<EmbeddingConfig>(k);
}

// Keras's Embedding.get_config() (keras/src/layers/core/embedding.py); lora_rank and lora_alpha
// appear only when LoRA is on.
std::vector<KerasKeySpec> keras_keys_embedding() {
  return {{"input_dim", KerasKey::kRead},
          {"output_dim", KerasKey::kRead},
          {"embeddings_initializer", KerasKey::kRead},
          {"embeddings_regularizer", KerasKey::kNull},
          {"embeddings_constraint", KerasKey::kNull},
          {"mask_zero", KerasKey::kFalse},
          {"sparse", KerasKey::kFalse},
          {"input_length", KerasKey::kNull},
          {"quantization_config", KerasKey::kNull},
          {"lora_rank", KerasKey::kNull},
          {"lora_alpha", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
