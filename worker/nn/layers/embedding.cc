// Keras's Embedding (docs/design.md#sequences): input_dim, output_dim, embeddings_initializer
// (Keras's RandomUniform, by default in [-0.05, 0.05), drawn from the model's seed). Takes a
// sequence of token ids (input_shape [T]) and gives each position its row of the table
// "embeddings" (input_dim, output_dim): a sequence of T positions of output_dim features. The
// table's gradient is a scatter-add in token order; the ids get none. mask_zero, regularizers,
// constraints and LoRA are not here.
#include <fmt/format.h>

#include <string>

#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

struct EmbeddingKeys {
  int input_dim = 0, output_dim = 0;
  UniformRange init;
};

class Embedding : public Layer {
 public:
  Embedding(const EmbeddingKeys& k, Dims in) : k_(k), positions_(in.h) {}
  std::vector<ParamInfo> params() const override {
    return {{"embeddings", {k_.input_dim, k_.output_dim}, 0, table()}};
  }
  void initialize(float* p, float*, uint64_t seed) const override {
    random_uniform(p, table(), k_.init, seed);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.embedding_forward(a.n * positions_, k_.input_dim, k_.output_dim, a.x[0], a.params, a.y);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    b.embedding_backward(a.n * positions_, k_.input_dim, k_.output_dim, a.x[0], a.dy, a.grads);
    if (enqueued) enqueued(0);
    // Ids are not differentiable: a layer that asks for their gradient (one that made them) gets
    // zeros. The model's own input asks for none.
    if (a.dx[0])
      b.device().fill_zero(a.dx[0], static_cast<size_t>(a.n) * positions_ * sizeof(float));
  }

 private:
  size_t table() const { return static_cast<size_t>(k_.input_dim) * k_.output_dim; }
  EmbeddingKeys k_;
  int positions_;
};

class EmbeddingConfig : public LayerConfig {
 public:
  explicit EmbeddingConfig(const EmbeddingKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    const Dims& x = in[0];
    if (!x.sequence || x.w != 1 || x.c != 1) {
      throw common::ConfigError(fmt::format(
          "{}: embedding takes a sequence of token ids (input_shape [T]), not {}", where,
          x.sequence ? fmt::format("a sequence of {} positions of {} features", x.h, x.w)
                     : fmt::format("a {}x{}x{} input", x.h, x.w, x.c)));
    }
    return {1, x.h, k_.output_dim, true};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<Embedding>(k_, in[0]);
  }

 private:
  EmbeddingKeys k_;
};

}  // namespace

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
