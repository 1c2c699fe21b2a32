// Keras's AveragePooling2D: pool_size (required, as Keras 3's), strides (default pool_size),
// padding "valid" or "same" (TensorFlow's: the odd pixel after, and each window's mean over its
// elements inside the input, never over the padding). No workspace: backward shares each
// output's gradient evenly over its window.
#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class AveragePool2D : public Layer {
 public:
  AveragePool2D(const PoolKeys& k, Dims in) : shape_(pool_shape(k, in)) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    b.avgpool_forward(at(a.n), a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.avgpool_backward(at(a.n), a.dy, a.dx[0]);
  }

 private:
  PoolShape at(int n) const {
    PoolShape s = shape_;
    s.n = n;
    return s;
  }
  PoolShape shape_;
};

class AveragePoolConfig : public LayerConfig {
 public:
  explicit AveragePoolConfig(const PoolKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    return pool_output_dims(k_, in[0], where);
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<AveragePool2D>(k_, in[0]);
  }
  LayerCost cost(const std::vector<Dims>& in) const override {
    LayerCost cost;
    cost.macs = static_cast<double>(pool_output_dims(k_, in[0], "").size()) * k_.pool_h * k_.pool_w;
    return cost;
  }

 private:
  PoolKeys k_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_average_pooling2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "pool_size", "strides", "padding"});
  return std::make_unique<AveragePoolConfig>(parse_pool_keys(node, true));
}

// Keras's AveragePooling2D.get_config() (keras/src/layers/pooling/base_pooling.py).
std::vector<KerasKeySpec> keras_keys_average_pooling2d() {
  return {{"pool_size", KerasKey::kRead},
          {"padding", KerasKey::kRead},
          {"strides", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
