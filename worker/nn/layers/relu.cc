// Keras's ReLU layer (max(x, 0); no keys of its own).
// Its keys and shape rules: worker/spec/layers/relu.h.
#include "worker/spec/layers/relu.h"

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class Relu : public Layer {
 public:
  explicit Relu(Dims dims) : dims_(dims) {}
  bool is_relu() const override { return true; }
  Blocking blocking() const override { return Blocking::kFollows; }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.relu_forward(dims_.size() * static_cast<size_t>(a.n), a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.relu_backward(dims_.size() * static_cast<size_t>(a.n), a.y, a.dy, a.dx[0]);
  }

 private:
  Dims dims_;
};

}  // namespace

std::unique_ptr<Layer> make_relu(const LayerConfig& /*config*/, const std::vector<Dims>& in,
                                 const LayerContext& /*c*/) {
  return std::make_unique<Relu>(in[0]);
}

}  // namespace dtrain::nn::layers
