// Keras's Conv2D: filters, kernel_size, strides, padding valid|same (TensorFlow's: the odd pixel
// after), activation, use_bias, kernel_ and bias_regularizer (L1L2 factors on its tensors,
// applied by the step). Kernel k,c,kh,kw (OIHW), glorot_uniform; bias zero. Without a
// bias the backend still gets one, zeros of the layer's own, and its gradient goes to scratch.
// Its keys and shape rules: worker/spec/layers/conv2d.h.
#include "worker/spec/layers/conv2d.h"

#include <algorithm>

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class Conv2D : public Activated {
 public:
  Conv2D(const Conv2dKeys& k, Dims in, Dims out, const LayerContext& c)
      : Activated(k.activation, out, c),
        use_bias_(k.use_bias),
        init_(k.init),
        kernel_regularizer_(k.kernel_regularizer),
        bias_regularizer_(k.bias_regularizer) {
    if (!use_bias_) {  // a zero bias to add, and somewhere for its gradient to go
      no_bias_ = Buffer<float>(c.backend.device(), 2 * static_cast<size_t>(k.filters));
      c.backend.device().fill_zero(no_bias_.data(), no_bias_.bytes());
    }
    shape_ = conv_shape_of(k, in);
    shape_.bias = use_bias_ ? 1 : 0;
  }
  std::vector<ParamInfo> params() const override {
    size_t kernel = shape_.weight_count();
    std::vector<ParamInfo> out = {{"kernel",
                                   {shape_.k, shape_.c, shape_.kh, shape_.kw},
                                   0,
                                   kernel,
                                   kernel_regularizer_.l1,
                                   kernel_regularizer_.l2}};
    if (use_bias_)
      out.push_back({"bias",
                     {shape_.k},
                     kernel,
                     static_cast<size_t>(shape_.k),
                     bias_regularizer_.l1,
                     bias_regularizer_.l2});
    return out;
  }
  Blocking blocking() const override { return Blocking::kAny; }
  void set_layouts(const std::vector<Layout>& in, Layout out) override {
    shape_.x_layout = in[0];
    shape_.y_layout = out;
  }
  void initialize(float* p, float*, uint64_t seed) const override {
    int area = shape_.kh * shape_.kw;
    size_t kernel = shape_.weight_count();
    initialize_kernel(init_, p, kernel, area * shape_.c, area * shape_.k, seed);
    if (use_bias_) std::fill(p + kernel, p + kernel + shape_.k, 0.0f);
  }
  bool reads_rounded() const override { return true; }
  bool reads_only_rounded_dy(Backend& b, int n) override {
    return linear() && b.conv2d_backward_reads_rounded_only(at(n));
  }
  // A fused ReLU's forward and weight gradient read x itself.
  bool reads_only_rounded_x(Backend& b, int n) override {
    return !relu() && b.conv2d_forward_reads_rounded_only(at(n));
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    const float* bias = use_bias_ ? a.params + shape_.weight_count() : no_bias_.data();
    if (relu())
      b.conv2d_relu_forward(at(a.n), a.x[0], a.params, bias, a.y);
    else if (a.x_rounded)
      b.conv2d_forward_rounded(at(a.n), a.x[0], a.x_rounded, a.params, bias, op_output(a.y));
    else
      b.conv2d_forward(at(a.n), a.x[0], a.params, bias, op_output(a.y));
    activate(b, a.n, a.y);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    float* db = use_bias_ ? a.grads + shape_.weight_count() : no_bias_.data() + shape_.k;
    if (relu() && !a.dx[0]) {  // nobody needs dx: no dz beyond the weight gradient
      b.conv2d_relu_backward_weights(at(a.n), a.x[0], a.y, a.dy, a.grads, db, scratch());
      if (enqueued) enqueued(0);
      return;
    }
    const float* dz = deactivate(b, a.n, a.y, a.dy);
    // x is the one this layer's forward was given (the model keeps activations until backward).
    auto done = [&] {
      if (enqueued) enqueued(0);
    };
    if (a.dy_rounded && dz == a.dy)  // the copy is of dy, not of an activation's gradient
      b.conv2d_backward_rounded(at(a.n), a.x[0], dz, a.dy_rounded, a.params, a.dx[0], a.grads, db,
                                done);
    else
      b.conv2d_backward(at(a.n), a.x[0], dz, a.params, a.dx[0], a.grads, db, done);
  }

 private:
  ConvShape at(int n) const {
    ConvShape s = shape_;
    s.n = n;
    return s;
  }
  ConvShape shape_;
  bool use_bias_;
  Initializer init_;
  Regularizer kernel_regularizer_, bias_regularizer_;
  Buffer<float> no_bias_;  ///< without a bias: k zeros, then k floats of its unused gradient
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(const LayerConfig& config, const std::vector<Dims>& in,
                                   const LayerContext& c) {
  const Conv2dKeys& k = static_cast<const Conv2dConfig&>(config).keys();
  return std::make_unique<Conv2D>(k, in[0], config.output_dims(in, ""), c);
}

}  // namespace dtrain::nn::layers
