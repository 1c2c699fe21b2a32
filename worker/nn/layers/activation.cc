// Keras's Activation layer: activation "relu", "linear", "softmax" (softmax only as the model's
// output, where the loss applies it, as on a dense layer), "sigmoid", "tanh", "gelu" or
// "silu"/"swish" (layer_keys.h). relu is max(x, 0); linear passes its input on; the others are
// the backend's eltwise operations, their gradient taken from the layer's input.
// Its keys and shape rules: worker/spec/layers/activation.h.
#include "worker/spec/layers/activation.h"

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class ActivationLayer : public Layer {
 public:
  ActivationLayer(Activation activation, Dims dims) : activation_(activation), dims_(dims) {}
  bool is_relu() const override { return activation_ == Activation::kRelu; }
  Blocking blocking() const override { return Blocking::kFollows; }  // elementwise
  void forward(Backend& b, const ForwardArgs& a) override {
    const size_t count = dims_.size() * static_cast<size_t>(a.n);
    Eltwise f;
    if (activation_ == Activation::kRelu)
      b.relu_forward(count, a.x[0], a.y);
    else if (eltwise_of(activation_, &f))
      b.eltwise_forward(f, count, a.x[0], a.y);
    else  // linear, or softmax, which the loss applies
      b.device().copy(a.y, a.x[0], count * sizeof(float));
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (!a.dx[0]) return;
    const size_t count = dims_.size() * static_cast<size_t>(a.n);
    Eltwise f;
    if (activation_ == Activation::kRelu)
      b.relu_backward(count, a.y, a.dy, a.dx[0]);
    else if (eltwise_of(activation_, &f))
      b.eltwise_backward(f, count, a.x[0], a.dy, a.dx[0]);
    else
      b.device().copy(a.dx[0], a.dy, count * sizeof(float));
  }

 private:
  Activation activation_;
  Dims dims_;
};

}  // namespace

std::unique_ptr<Layer> make_activation(const LayerConfig& config, const std::vector<Dims>& in,
                                       const LayerContext& /*c*/) {
  const ActivationKeys& k = static_cast<const ActivationConfig&>(config).keys();
  return std::make_unique<ActivationLayer>(k.activation, in[0]);
}

}  // namespace dtrain::nn::layers
