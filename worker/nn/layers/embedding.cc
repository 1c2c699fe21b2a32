// Keras's Embedding (docs/design.md#sequences): input_dim, output_dim, embeddings_initializer
// (Keras's RandomUniform, by default in [-0.05, 0.05), drawn from the model's seed). Takes a
// sequence of token ids (input_shape [T]) and gives each position its row of the table
// "embeddings" (input_dim, output_dim): a sequence of T positions of output_dim features. The
// table's gradient is a scatter-add in token order; the ids get none. mask_zero, regularizers,
// constraints and LoRA are not here.
// Its keys and shape rules: worker/spec/layers/embedding.h.
#include "worker/spec/layers/embedding.h"

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

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

}  // namespace

std::unique_ptr<Layer> make_embedding(const LayerConfig& config, const std::vector<Dims>& in,
                                      const LayerContext& /*c*/) {
  return std::make_unique<Embedding>(static_cast<const EmbeddingConfig&>(config).keys(), in[0]);
}

}  // namespace dtrain::nn::layers
