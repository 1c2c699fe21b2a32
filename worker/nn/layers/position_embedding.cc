// keras_hub's PositionEmbedding (docs/design.md#sequences): a learned table "embeddings"
// (sequence_length, D), glorot_uniform by default; its output, for a sequence of T <=
// sequence_length positions of D features, is the table's first T rows, the same for every example
// (it reads only its input's shape, and gives it no gradient). The table's gradient sums the
// examples' in order. Keras adds it to the token embeddings with an Add layer;
// TokenAndPositionEmbedding (token_and_position_embedding.cc) does both in one.
// Its keys and shape rules: worker/spec/layers/position_embedding.h.
#include "worker/spec/layers/position_embedding.h"

#include "worker/nn/layers/layer_parts.h"
#include "worker/nn/layers/position_rows.h"

namespace dtrain::nn::layers {
namespace {

class PositionEmbedding : public Layer {
 public:
  PositionEmbedding(int length, Initializer init, Dims in)
      : length_(length), init_(init), t_(in.h), d_(in.w) {}
  std::vector<ParamInfo> params() const override {
    return {{"embeddings", {length_, d_}, 0, static_cast<size_t>(length_) * d_}};
  }
  void initialize(float* p, float*, uint64_t seed) const override {
    initialize_kernel(init_, p, static_cast<size_t>(length_) * d_, length_, d_, seed);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    position_rows_forward(b, a.n, t_, d_, a.params, a.y);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    position_rows_backward(b, a.n, t_, d_, length_, a.dy, a.grads);
    if (enqueued) enqueued(0);
    if (a.dx[0]) b.device().fill_zero(a.dx[0], static_cast<size_t>(a.n) * t_ * d_ * sizeof(float));
  }

 private:
  int length_;
  Initializer init_;
  int t_, d_;
};

}  // namespace

std::unique_ptr<Layer> make_position_embedding(const LayerConfig& config,
                                               const std::vector<Dims>& in,
                                               const LayerContext& /*c*/) {
  const PositionEmbeddingKeys& k = static_cast<const PositionEmbeddingConfig&>(config).keys();
  return std::make_unique<PositionEmbedding>(k.length, k.init, in[0]);
}

}  // namespace dtrain::nn::layers
