// Keras's Add: the elementwise sum of two or more inputs of one shape (a residual connection).
// Its gradient is the output's, to every input. A ReLU that is its only user runs inside it
// (fuse_relu, docs/design.md#fusion): the output is max(sum, 0) and every input's gradient is the
// output's masked where that is 0.
// Its keys and shape rules: worker/spec/layers/add.h.
#include "worker/spec/layers/add.h"

#include <array>

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class Add : public Layer {
 public:
  explicit Add(Dims dims) : dims_(dims) {}
  bool fuse_relu() override { return relu_ = true; }
  bool is_add() const override { return true; }
  bool same_gradient_to_inputs() const override { return true; }
  bool takes_gradient_addend() const override { return true; }
  Blocking blocking() const override { return Blocking::kFollows; }  // elementwise
  void forward(Backend& b, const ForwardArgs& a) override {
    size_t count = dims_.size() * static_cast<size_t>(a.n);
    b.add_forward(count, a.x.data(), static_cast<int>(a.x.size()), relu_, a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    size_t count = dims_.size() * static_cast<size_t>(a.n);
    // The first input's gradient is dy (plus the share the model left, dy_addend), masked with
    // the ReLU; the others are copies of it, but for an input whose gradient is the same memory
    // (the model's sharing), already written.
    const float* gradient = a.dy;
    for (float* dx : a.dx) {
      if (!dx || dx == gradient) continue;
      if (gradient != a.dy)
        b.device().copy(dx, gradient, count * sizeof(float));
      else if (a.dy_addend && relu_)
        b.relu_backward_added(count, a.y, a.dy, a.dy_addend, dx);
      else if (a.dy_addend)
        b.add_forward(count, std::array<const float*, 2>{a.dy, a.dy_addend}.data(), 2, false, dx);
      else if (relu_)
        b.relu_backward(count, a.y, a.dy, dx);
      else
        b.device().copy(dx, gradient, count * sizeof(float));
      gradient = dx;
    }
  }

 private:
  Dims dims_;
  bool relu_ = false;  ///< a ReLU fused after it
};

}  // namespace

std::unique_ptr<Layer> make_add(const LayerConfig& /*config*/, const std::vector<Dims>& in,
                                const LayerContext& /*c*/) {
  return std::make_unique<Add>(in[0]);
}

}  // namespace dtrain::nn::layers
