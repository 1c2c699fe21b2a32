// What the built layers of worker/nn/layers/ share: the backend's shape of a pooling, Keras's
// initializers' draws (pure functions of the seed), and a base for layers whose op an activation
// may follow (ReLU fused into the op's forward, the others applied after it; undone in backward
// with the layer's own scratch). The keys these read are worker/spec/layers/layer_keys.h's. Not
// a layer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/nn/layer.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

/// The backend's shape of pooling one example of size in (n = 1).
PoolShape pool_shape(const PoolKeys& k, const Dims& in);

/// Keras's glorot_uniform of a kernel with these fans, a pure function of seed.
void glorot_uniform(float* w, size_t count, int fan_in, int fan_out, uint64_t seed);

/// The kernel's initial values, a pure function of seed: uniform in +-sqrt(3 scale / n), or a
/// normal of stddev sqrt(scale / n) / 0.87962566103423978 cut at two of its deviations (Keras's
/// truncated normal), with scale and n as Keras's VarianceScaling has them for the initializer.
void initialize_kernel(Initializer init, float* w, size_t count, int fan_in, int fan_out,
                       uint64_t seed);

/// count values uniform in the range, value i a pure function of (seed, i).
void random_uniform(float* w, size_t count, UniformRange range, uint64_t seed);

/// The dense backward calls of one gradient dy, in the scope of this object, as
/// Backend::begin_dense_backward() says: dy must not change while it lives.
class HeldGradient {
 public:
  HeldGradient(Backend& b, const float* dy, size_t count) : b_(b) {
    b_.begin_dense_backward(dy, count);
  }
  ~HeldGradient() { b_.end_dense_backward(); }
  HeldGradient(const HeldGradient&) = delete;
  HeldGradient& operator=(const HeldGradient&) = delete;

 private:
  Backend& b_;
};

/// A layer whose op may be followed by an activation: relu fused into the op's forward, or an
/// eltwise one (sigmoid, tanh, gelu, swish) applied to the op's output, which the layer keeps in
/// scratch of its own for the backward; the activation's gradient is applied before the op's
/// backward, into scratch of the layer's own.
class Activated : public Layer {
 protected:
  Activated(Activation activation, Dims out, const LayerContext& c);
  bool relu() const { return activation_ == Activation::kRelu; }
  /// True when deactivate() hands dy back as it is.
  bool linear() const { return !eltwise_ && !relu(); }
  /// Where the op writes its output for a forward into y: y itself, or (an eltwise activation)
  /// the layer's scratch, which activate() then maps into y.
  float* op_output(float* y) { return eltwise_ ? pre_.data() : y; }
  /// y = f(op output) for an eltwise activation; nothing otherwise.
  void activate(Backend& b, int n, float* y);
  /// dy through the activation: dy itself when linear (softmax is fused into the loss).
  const float* deactivate(Backend& b, int n, const float* y, const float* dy);
  float* scratch() { return delta_.data(); }
  Activation activation_;
  Dims out_;

 private:
  bool eltwise_ = false;
  Eltwise f_ = Eltwise::kSigmoid;
  Buffer<float> delta_;
  Buffer<float> pre_;  ///< an eltwise activation's input, for its backward
};

}  // namespace dtrain::nn::layers
