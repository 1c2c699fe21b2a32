// Keras's Add: the elementwise sum of two or more inputs of one shape (a residual connection).
// Its gradient is the output's, to every input.
#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class Add : public Layer {
 public:
  explicit Add(Dims dims) : dims_(dims) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    size_t count = dims_.size() * static_cast<size_t>(a.n);
    b.device().copy(a.y, a.x[0], count * sizeof(float));
    for (size_t i = 1; i < a.x.size(); ++i) b.add(count, a.x[i], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    size_t count = dims_.size() * static_cast<size_t>(a.n);
    for (float* dx : a.dx) {
      if (dx) b.device().copy(dx, a.dy, count * sizeof(float));
    }
  }

 private:
  Dims dims_;
};

class AddConfig : public LayerConfig {
 public:
  int arity() const override { return 0; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    for (size_t i = 1; i < in.size(); ++i) {
      if (in[i] != in[0]) {
        throw common::ConfigError(fmt::format(
            "{}: add needs inputs of one shape; input 0 is {}x{}x{}, input {} is {}x{}x{}", where,
            in[0].h, in[0].w, in[0].c, i, in[i].h, in[i].w, in[i].c));
      }
    }
    return in[0];
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<Add>(in[0]);
  }
};

}  // namespace

std::unique_ptr<LayerConfig> parse_add(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs"});
  return std::make_unique<AddConfig>();
}

// Keras's Add has no config keys beyond Layer's own.
std::vector<KerasKeySpec> keras_keys_add() {
  return {};
}

}  // namespace dtrain::nn::layers
