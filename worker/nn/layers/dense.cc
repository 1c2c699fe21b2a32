// Keras's Dense on flat input, or on a sequence's last axis (each of its positions, as Keras's on
// a 3-D input: the products take n x positions rows): units, activation (spec layer_keys.h's),
// use_bias, kernel_ and bias_regularizer (L1L2 factors on its tensors, applied by the step).
// Kernel in,out (Keras's), glorot_uniform; bias zero (without one: zeros of the layer's own, its
// gradient to scratch). Backward produces a large kernel's gradient in pieces of whole rows, last
// rows first, so its all-reduce starts while the rest is computed.
// Its keys and shape rules: worker/spec/layers/dense.h.
#include "worker/spec/layers/dense.h"

#include <algorithm>

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class Dense : public Activated {
 public:
  Dense(const DenseKeys& k, Dims in, Dims out, const LayerContext& c)
      : Activated(k.activation, out, c),
        in_(in.sequence ? in.w : static_cast<int>(in.size())),
        units_(k.units),
        positions_(in.positions()),
        use_bias_(k.use_bias),
        init_(k.init),
        kernel_regularizer_(k.kernel_regularizer),
        bias_regularizer_(k.bias_regularizer) {
    if (!use_bias_) {
      no_bias_ = Buffer<float>(c.backend.device(), static_cast<size_t>(k.units));
      c.backend.device().fill_zero(no_bias_.data(), no_bias_.bytes());
    }
  }
  std::vector<ParamInfo> params() const override {
    size_t kernel = static_cast<size_t>(in_) * units_;
    std::vector<ParamInfo> out = {
        {"kernel", {in_, units_}, 0, kernel, kernel_regularizer_.l1, kernel_regularizer_.l2}};
    if (use_bias_)
      out.push_back({"bias",
                     {units_},
                     kernel,
                     static_cast<size_t>(units_),
                     bias_regularizer_.l1,
                     bias_regularizer_.l2});
    return out;
  }
  // The bias, then the kernel in pieces of whole rows, last rows first.
  std::vector<ParamRange> gradient_pieces() const override {
    size_t kernel = static_cast<size_t>(in_) * units_;
    std::vector<ParamRange> pieces;
    if (use_bias_) pieces.push_back({kernel, static_cast<size_t>(units_)});
    size_t rows_per_piece = std::max<size_t>(1, kGradientPieceFloats / units_);
    for (size_t end = in_; end > 0;) {
      size_t begin = end > rows_per_piece ? end - rows_per_piece : 0;
      pieces.push_back({begin * units_, (end - begin) * units_});
      end = begin;
    }
    return pieces;
  }
  void initialize(float* p, float*, uint64_t seed) const override {
    size_t kernel = static_cast<size_t>(in_) * units_;
    initialize_kernel(init_, p, kernel, in_, units_, seed);
    if (use_bias_) std::fill(p + kernel, p + kernel + units_, 0.0f);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    const int rows = a.n * positions_;
    const float* bias = use_bias_ ? a.params + static_cast<size_t>(in_) * units_ : no_bias_.data();
    if (relu())
      b.dense_relu_forward(rows, in_, units_, a.x[0], a.params, bias, a.y);
    else
      b.dense_forward(rows, in_, units_, a.x[0], a.params, bias, op_output(a.y));
    activate(b, a.n, a.y);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    const float* dz = deactivate(b, a.n, a.y, a.dy);
    const int rows = a.n * positions_;
    const float* x = a.x[0];
    float* dx = a.dx[0];
    const HeldGradient held(b, dz, static_cast<size_t>(rows) * units_);
    // The bias, then the kernel from its last rows to its first: each piece extends the
    // gradients produced so far downwards, so buckets stay contiguous.
    if (use_bias_)
      b.dense_backward_bias(rows, units_, dz, a.grads + static_cast<size_t>(in_) * units_);
    if (!enqueued) {  // nobody waits for pieces: one product for the whole kernel
      b.dense_backward_weight_rows(rows, in_, units_, x, dz, a.grads, 0, in_);
      if (dx) b.dense_backward_data(rows, in_, units_, dz, a.params, dx);
      return;
    }
    const size_t first_rows = use_bias_ ? 1 : 0;  // piece 0 is the bias's
    if (use_bias_) enqueued(0);
    std::vector<ParamRange> pieces = gradient_pieces();
    for (size_t k = first_rows; k < pieces.size(); ++k) {
      int first = static_cast<int>(pieces[k].offset / units_);
      int last = static_cast<int>((pieces[k].offset + pieces[k].count) / units_);
      b.dense_backward_weight_rows(rows, in_, units_, x, dz, a.grads, first, last);
      enqueued(k);
    }
    if (dx) b.dense_backward_data(rows, in_, units_, dz, a.params, dx);
  }

 private:
  int in_;  ///< features of each row: a flat input's, or each position's
  int units_;
  int positions_;  ///< rows per example: a sequence's positions, else 1
  bool use_bias_;
  Initializer init_;
  Regularizer kernel_regularizer_, bias_regularizer_;
  Buffer<float> no_bias_;  ///< without a bias: units zeros
};

}  // namespace

std::unique_ptr<Layer> make_dense(const LayerConfig& config, const std::vector<Dims>& in,
                                  const LayerContext& c) {
  const DenseKeys& k = static_cast<const DenseConfig&>(config).keys();
  return std::make_unique<Dense>(k, in[0], config.output_dims(in, ""), c);
}

}  // namespace dtrain::nn::layers
