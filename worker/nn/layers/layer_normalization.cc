// Keras's LayerNormalization on the last axis (docs/design.md#sequences): each position of a
// sequence (its w features), or a flat input's features, normalized by its own mean and biased
// variance; epsilon 1e-3, center (beta), scale (gamma), Keras's defaults. The same in training
// and inference: no state. The mean and 1 / sqrt(var + epsilon) of each row its forward
// computed are kept in the layer's own scratch for the backward. rms_scaling, other axes and
// images are not here.
// Its keys and shape rules: worker/spec/layers/layer_normalization.h.
#include "worker/spec/layers/layer_normalization.h"

#include <algorithm>

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

/// The features of each normalized row, and the rows per example.
int features_of(const Dims& in) {
  return in.sequence ? in.w : static_cast<int>(in.size());
}

class LayerNormalization : public Layer {
 public:
  LayerNormalization(const LayerNormKeys& k, Dims in, const LayerContext& c)
      : k_(k),
        features_(features_of(in)),
        positions_(in.positions()),
        max_rows_(static_cast<size_t>(c.max_batch) * in.positions()),
        saved_(c.backend.device(), 2 * max_rows_) {}
  std::vector<ParamInfo> params() const override {
    std::vector<ParamInfo> out;
    const size_t f = static_cast<size_t>(features_);
    if (k_.scale) out.push_back({"gamma", {features_}, 0, f});
    if (k_.center) out.push_back({"beta", {features_}, k_.scale ? f : 0, f});
    return out;
  }
  void initialize(float* p, float*, uint64_t) const override {
    const size_t f = static_cast<size_t>(features_);
    if (k_.scale) std::fill(p, p + f, 1.0f);
    if (k_.center) std::fill(p + (k_.scale ? f : 0), p + (k_.scale ? 2 * f : f), 0.0f);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.layernorm_forward(a.n * positions_, features_, k_.epsilon, a.x[0], gamma(a.params),
                        beta(a.params), a.y, saved_.data(), saved_.data() + max_rows_);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    float* dgamma = k_.scale ? a.grads : nullptr;
    float* dbeta = k_.center ? a.grads + (k_.scale ? features_ : 0) : nullptr;
    b.layernorm_backward(a.n * positions_, features_, a.x[0], a.dy, gamma(a.params), saved_.data(),
                         saved_.data() + max_rows_, a.dx[0], dgamma, dbeta);
    if (enqueued && (k_.scale || k_.center)) enqueued(0);
  }

 private:
  const float* gamma(const float* p) const { return k_.scale ? p : nullptr; }
  const float* beta(const float* p) const {
    return k_.center ? p + (k_.scale ? features_ : 0) : nullptr;
  }
  LayerNormKeys k_;
  int features_, positions_;
  size_t max_rows_;
  Buffer<float> saved_;  ///< the last forward's mean (max_rows_), then its rstd (max_rows_)
};

}  // namespace

std::unique_ptr<Layer> make_layer_normalization(const LayerConfig& config,
                                                const std::vector<Dims>& in,
                                                const LayerContext& c) {
  const LayerNormKeys& k = static_cast<const LayerNormalizationConfig&>(config).keys();
  return std::make_unique<LayerNormalization>(k, in[0], c);
}

}  // namespace dtrain::nn::layers
