// Keras's MaxPooling2D: pool_size (default 2), strides (default pool_size), padding "valid" or
// "same" (TensorFlow's: the odd pixel after, and a window's maximum over its elements inside the
// input). The forward keeps the workspace its backward needs, sized for the largest batch.
// Its keys and shape rules: worker/spec/layers/max_pooling2d.h.
#include "worker/spec/layers/max_pooling2d.h"

#include "common/errors.h"
#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class MaxPool2D : public Layer {
 public:
  MaxPool2D(const PoolKeys& k, Dims in, const LayerContext& c) : shape_(pool_shape(k, in)) {
    workspace_ = Buffer<unsigned char>(c.backend.device(),
                                       c.backend.maxpool_workspace_bytes(at(c.max_batch)));
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    PoolShape s = at(a.n);
    DT_ENFORCE(b.maxpool_workspace_bytes(s) <= workspace_.size(), "pool workspace for batch {}",
               a.n);
    b.maxpool_forward(s, a.x[0], a.y, workspace_.data());
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.maxpool_backward(at(a.n), a.dy, workspace_.data(), a.dx[0]);
  }

 private:
  PoolShape at(int n) const {
    PoolShape s = shape_;
    s.n = n;
    return s;
  }
  PoolShape shape_;
  Buffer<unsigned char> workspace_;
};

}  // namespace

std::unique_ptr<Layer> make_max_pooling2d(const LayerConfig& config, const std::vector<Dims>& in,
                                          const LayerContext& c) {
  return std::make_unique<MaxPool2D>(static_cast<const MaxPooling2dConfig&>(config).keys(), in[0],
                                     c);
}

}  // namespace dtrain::nn::layers
