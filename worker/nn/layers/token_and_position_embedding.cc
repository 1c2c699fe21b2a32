// keras_hub's TokenAndPositionEmbedding (docs/design.md#sequences): a token table
// token_embedding.embeddings (vocabulary_size, embedding_dim) and a position table
// position_embedding.embeddings (sequence_length, embedding_dim), both from
// embeddings_initializer (Keras's "uniform": in [-0.05, 0.05)); each position of a sequence of
// token ids gets its token's row plus its position's. Gradients: the token table's a scatter-add
// in token order (Backend::embedding_backward), the position table's the examples' sum in order;
// the ids get none. mask_zero and untied weights (tie_weights false adds a reverse table dtrain
// does not keep) are not here.
// Its keys and shape rules: worker/spec/layers/token_and_position_embedding.h.
#include "worker/spec/layers/token_and_position_embedding.h"

#include "worker/nn/layers/layer_parts.h"
#include "worker/nn/layers/position_rows.h"

namespace dtrain::nn::layers {
namespace {

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

}  // namespace

std::unique_ptr<Layer> make_token_and_position_embedding(const LayerConfig& config,
                                                         const std::vector<Dims>& in,
                                                         const LayerContext& /*c*/) {
  const TokenPositionKeys& k = static_cast<const TokenAndPositionEmbeddingConfig&>(config).keys();
  return std::make_unique<TokenAndPositionEmbedding>(k, in[0]);
}

}  // namespace dtrain::nn::layers
