// Keras's ReLU layer (max(x, 0); no keys of its own).
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class Relu : public Layer {
 public:
  explicit Relu(Dims dims) : dims_(dims) {}
  bool is_relu() const override { return true; }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.relu_forward(dims_.size() * static_cast<size_t>(a.n), a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.relu_backward(dims_.size() * static_cast<size_t>(a.n), a.y, a.dy, a.dx[0]);
  }

 private:
  Dims dims_;
};

class ReluConfig : public LayerConfig {
 public:
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override { return in[0]; }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<Relu>(in[0]);
  }
  Activation activation() const override { return Activation::kRelu; }
};

}  // namespace

std::unique_ptr<LayerConfig> parse_relu(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs"});
  return std::make_unique<ReluConfig>();
}

// Keras's ReLU.get_config() (keras/src/layers/activations/relu.py): only the plain max(x, 0).
std::vector<KerasKeySpec> keras_keys_relu() {
  return {{"max_value", KerasKey::kNull},
          {"negative_slope", KerasKey::kZero},
          {"threshold", KerasKey::kZero}};
}

}  // namespace dtrain::nn::layers
