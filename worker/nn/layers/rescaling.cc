// Keras's Rescaling: y = x * scale + offset, in training and inference alike; scale required,
// offset 0. Numbers only (Keras also takes a per-channel array: refused). Backward: dx = dy *
// scale.
// Its keys and shape rules: worker/spec/layers/rescaling.h.
#include "worker/spec/layers/rescaling.h"

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class Rescaling : public Layer {
 public:
  Rescaling(float scale, float offset, Dims dims) : scale_(scale), offset_(offset), dims_(dims) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    b.scale_shift(dims_.size() * static_cast<size_t>(a.n), scale_, offset_, a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0])
      b.scale_shift(dims_.size() * static_cast<size_t>(a.n), scale_, 0.0f, a.dy, a.dx[0]);
  }

 private:
  float scale_, offset_;
  Dims dims_;
};

}  // namespace

std::unique_ptr<Layer> make_rescaling(const LayerConfig& config, const std::vector<Dims>& in,
                                      const LayerContext& /*c*/) {
  const RescalingKeys& k = static_cast<const RescalingConfig&>(config).keys();
  return std::make_unique<Rescaling>(k.scale, k.offset, in[0]);
}

}  // namespace dtrain::nn::layers
