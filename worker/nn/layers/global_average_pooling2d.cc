// Keras's GlobalAveragePooling2D: each channel's mean over its pixels, a flat output of the
// channels (keepdims gives the same 1x1xC). Computed as a product with a column of 1 / pixels
// (backend.h's dense ops), so it runs on every backend without an operation of its own. An input
// in blocks of channels is reordered to plain first, and its gradient back (the same bits).
// Its keys and shape rules: worker/spec/layers/global_average_pooling2d.h.
#include "worker/spec/layers/global_average_pooling2d.h"

#include <vector>

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class GlobalAveragePooling2D : public Layer {
 public:
  GlobalAveragePooling2D(Dims in, const LayerContext& c)
      : in_(in),
        max_batch_(c.max_batch),
        weights_(c.backend.device(), static_cast<size_t>(in.h) * in.w + 1) {
    const size_t pixels = static_cast<size_t>(in.h) * in.w;
    std::vector<float> host(pixels, 1.0f / static_cast<float>(pixels));
    host.push_back(0.0f);  // the product's bias
    weights_.from_host(host);
  }
  Blocking blocking() const override { return Blocking::kReads; }
  void set_layouts(const std::vector<Layout>& in, Layout /*out*/) override {
    blocked_ = in[0] == Layout::kBlocked;
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    const float* x = a.x[0];
    if (blocked_) {
      b.reorder_channels(a.n, in_.c, pixels(), Layout::kPlain, x, plain(b));
      x = plain_.data();
    }
    b.dense_forward(a.n * in_.c, pixels(), 1, x, weights_.data(), weights_.data() + pixels(), a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (!a.dx[0]) return;
    float* dx = blocked_ ? plain(b) : a.dx[0];
    b.dense_backward_data(a.n * in_.c, pixels(), 1, a.dy, weights_.data(), dx);
    if (blocked_) b.reorder_channels(a.n, in_.c, pixels(), Layout::kBlocked, dx, a.dx[0]);
  }

 private:
  int pixels() const { return in_.h * in_.w; }
  float* plain(Backend& b) {
    if (plain_.size() == 0) plain_ = Buffer<float>(b.device(), in_.size() * max_batch_);
    return plain_.data();
  }
  Dims in_;
  int max_batch_;
  Buffer<float> weights_;  ///< 1 / pixels for each pixel, then a zero bias
  bool blocked_ = false;   ///< its input (and dx) in blocks of channels
  Buffer<float> plain_;    ///< then: the input, or dx, in plain NCHW
};

}  // namespace

std::unique_ptr<Layer> make_global_average_pooling2d(const LayerConfig& /*config*/,
                                                     const std::vector<Dims>& in,
                                                     const LayerContext& c) {
  return std::make_unique<GlobalAveragePooling2D>(in[0], c);
}

}  // namespace dtrain::nn::layers
