// Keras's AveragePooling2D: pool_size (required, as Keras 3's), strides (default pool_size),
// padding "valid" or "same" (TensorFlow's: the odd pixel after, and each window's mean over its
// elements inside the input, never over the padding). No workspace: backward shares each
// output's gradient evenly over its window.
// Its keys and shape rules: worker/spec/layers/average_pooling2d.h.
#include "worker/spec/layers/average_pooling2d.h"

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class AveragePool2D : public Layer {
 public:
  AveragePool2D(const PoolKeys& k, Dims in) : shape_(pool_shape(k, in)) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    b.avgpool_forward(at(a.n), a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.avgpool_backward(at(a.n), a.dy, a.dx[0]);
  }

 private:
  PoolShape at(int n) const {
    PoolShape s = shape_;
    s.n = n;
    return s;
  }
  PoolShape shape_;
};

}  // namespace

std::unique_ptr<Layer> make_average_pooling2d(const LayerConfig& config,
                                              const std::vector<Dims>& in,
                                              const LayerContext& /*c*/) {
  return std::make_unique<AveragePool2D>(static_cast<const AveragePooling2dConfig&>(config).keys(),
                                         in[0]);
}

}  // namespace dtrain::nn::layers
