// keras_hub's TokenAndPositionEmbedding (docs/design.md#sequences): a token table
// token_embedding.embeddings (vocabulary_size, embedding_dim) and a position table
// position_embedding.embeddings (sequence_length, embedding_dim), both from
// embeddings_initializer (Keras's "uniform": in [-0.05, 0.05)); each position of a sequence of
// token ids gets its token's row plus its position's. Gradients: the token table's a scatter-add
// in token order (Backend::embedding_backward), the position table's the examples' sum in order;
// the ids get none. mask_zero and untied weights (tie_weights false adds a reverse table dtrain
// does not keep) are not here.
#include <fmt/format.h>

#include <string>

#include "worker/nn/layers/layer_keys.h"
#include "worker/nn/layers/position_rows.h"

namespace dtrain::nn::layers {
namespace {

struct TokenPositionKeys {
  int vocabulary = 0, length = 0, dim = 0;
  UniformRange init;
};

class TokenAndPositionEmbedding : public Layer {
 public:
  TokenAndPositionEmbedding(const TokenPositionKeys& k, Dims in) : k_(k), t_(in.h) {}
  std::vector<ParamInfo> params() const override {
    return {{"token_embedding.embeddings", {k_.vocabulary, k_.dim}, 0, tokens()},
            {"position_embedding.embeddings", {k_.length, k_.dim}, tokens(), positions()}};
  }
  void initialize(float* p, float*, uint64_t seed) const override {
    random_uniform(p, tokens() + positions(), k_.init, seed);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.embedding_forward(a.n * t_, k_.vocabulary, k_.dim, a.x[0], a.params, a.y);
    position_rows_forward(b, a.n, t_, k_.dim, a.params + tokens(), a.y, true);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    b.embedding_backward(a.n * t_, k_.vocabulary, k_.dim, a.x[0], a.dy, a.grads);
    position_rows_backward(b, a.n, t_, k_.dim, k_.length, a.dy, a.grads + tokens());
    if (enqueued) enqueued(0);
    if (a.dx[0]) b.device().fill_zero(a.dx[0], static_cast<size_t>(a.n) * t_ * sizeof(float));
  }

 private:
  size_t tokens() const { return static_cast<size_t>(k_.vocabulary) * k_.dim; }
  size_t positions() const { return static_cast<size_t>(k_.length) * k_.dim; }
  TokenPositionKeys k_;
  int t_;
};

class TokenAndPositionEmbeddingConfig : public LayerConfig {
 public:
  explicit TokenAndPositionEmbeddingConfig(const TokenPositionKeys& k) : k_(k) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    const Dims& x = in[0];
    if (!x.sequence || x.w != 1 || x.c != 1) {
      throw common::ConfigError(fmt::format(
          "{}: token_and_position_embedding takes a sequence of token ids (input_shape [T])",
          where));
    }
    if (x.h > k_.length) {
      throw common::ConfigError(
          fmt::format("{}: its input has {} positions, more than its sequence_length {}", where,
                      x.h, k_.length));
    }
    return {1, x.h, k_.dim, true};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<TokenAndPositionEmbedding>(k_, in[0]);
  }
  bool gpu_tested() const override { return false; }

 private:
  TokenPositionKeys k_;
};

}  // namespace

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
