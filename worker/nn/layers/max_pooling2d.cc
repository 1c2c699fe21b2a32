// Keras's MaxPooling2D: pool_size (default 2), strides (default pool_size), padding "valid" or
// "same" (TensorFlow's: the odd pixel after, and a window's maximum over its elements inside the
// input). The forward keeps the workspace its backward needs, sized for the largest batch.
#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class MaxPool2D : public Layer {
 public:
  MaxPool2D(const PoolKeys& k, Dims in, const LayerContext& c) : shape_(pool_shape(k, in)) {
    workspace_ = Buffer<unsigned char>(c.backend.device(),
                                       c.backend.maxpool_workspace_bytes(at(c.max_batch)));
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    PoolShape s = at(a.n);
    DT_ENFORCE(b.maxpool_workspace_bytes(s) <= workspace_.size(), "pool workspace for batch {}",
               a.n);
    b.maxpool_forward(s, a.x[0], a.y, workspace_.data());
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.maxpool_backward(at(a.n), a.dy, workspace_.data(), a.dx[0]);
  }

 private:
  PoolShape at(int n) const {
    PoolShape s = shape_;
    s.n = n;
    return s;
  }
  PoolShape shape_;
  Buffer<unsigned char> workspace_;
};

class PoolConfig : public LayerConfig {
 public:
  explicit PoolConfig(const PoolKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    return pool_output_dims(k_, in[0], where);
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<MaxPool2D>(k_, in[0], c);
  }
  bool gpu_tested() const override { return !k_.same; }  // the GPU's pooling has no padding yet

 private:
  PoolKeys k_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_max_pooling2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "pool_size", "strides", "padding"});
  return std::make_unique<PoolConfig>(parse_pool_keys(node, false));
}

// Keras's MaxPooling2D.get_config() (keras/src/layers/pooling/base_pooling.py).
std::vector<KerasKeySpec> keras_keys_max_pooling2d() {
  return {{"pool_size", KerasKey::kRead},
          {"padding", KerasKey::kRead},
          {"strides", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
