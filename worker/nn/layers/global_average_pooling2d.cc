// Keras's GlobalAveragePooling2D: each channel's mean over its pixels, a flat output of the
// channels (keepdims gives the same 1x1xC). Computed as a product with a column of 1 / pixels
// (backend.h's dense ops), so it runs on every backend without an operation of its own.
// Its keys and shape rules: worker/spec/layers/global_average_pooling2d.h.
#include "worker/spec/layers/global_average_pooling2d.h"

#include <vector>

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class GlobalAveragePooling2D : public Layer {
 public:
  GlobalAveragePooling2D(Dims in, const LayerContext& c)
      : in_(in), weights_(c.backend.device(), static_cast<size_t>(in.h) * in.w + 1) {
    const size_t pixels = static_cast<size_t>(in.h) * in.w;
    std::vector<float> host(pixels, 1.0f / static_cast<float>(pixels));
    host.push_back(0.0f);  // the product's bias
    weights_.from_host(host);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.dense_forward(a.n * in_.c, pixels(), 1, a.x[0], weights_.data(), weights_.data() + pixels(),
                    a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.dense_backward_data(a.n * in_.c, pixels(), 1, a.dy, weights_.data(), a.dx[0]);
  }

 private:
  int pixels() const { return in_.h * in_.w; }
  Dims in_;
  Buffer<float> weights_;  ///< 1 / pixels for each pixel, then a zero bias
};

}  // namespace

std::unique_ptr<Layer> make_global_average_pooling2d(const LayerConfig& /*config*/,
                                                     const std::vector<Dims>& in,
                                                     const LayerContext& c) {
  return std::make_unique<GlobalAveragePooling2D>(in[0], c);
}

}  // namespace dtrain::nn::layers
