// Keras's GlobalAveragePooling2D: each channel's mean over its pixels, a flat output of the
// channels (keepdims gives the same 1x1xC). Computed as a product with a column of 1 / pixels
// (backend.h's dense ops), so it runs on every backend without an operation of its own.
#include <fmt/format.h>

#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class GlobalAveragePooling2D : public Layer {
 public:
  GlobalAveragePooling2D(Dims in, const LayerContext& c)
      : in_(in), weights_(c.backend.device(), static_cast<size_t>(in.h) * in.w + 1) {
    const size_t pixels = static_cast<size_t>(in.h) * in.w;
    std::vector<float> host(pixels, 1.0f / static_cast<float>(pixels));
    host.push_back(0.0f);  // the product's bias
    weights_.from_host(host);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.dense_forward(a.n * in_.c, pixels(), 1, a.x[0], weights_.data(), weights_.data() + pixels(),
                    a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.dense_backward_data(a.n * in_.c, pixels(), 1, a.dy, weights_.data(), a.dx[0]);
  }

 private:
  int pixels() const { return in_.h * in_.w; }
  Dims in_;
  Buffer<float> weights_;  ///< 1 / pixels for each pixel, then a zero bias
};

class PoolConfig : public LayerConfig {
 public:
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "global_average_pooling2d");
    return {in[0].c, 1, 1};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<GlobalAveragePooling2D>(in[0], c);
  }
  LayerCost cost(const std::vector<Dims>& in) const override {
    LayerCost cost;
    cost.macs = static_cast<double>(in[0].size());
    return cost;
  }
};

}  // namespace

std::unique_ptr<LayerConfig> parse_global_average_pooling2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "keepdims"});
  if (auto n = node.find("keepdims")) n->as_bool();  // 1x1xC either way in dtrain's layout
  return std::make_unique<PoolConfig>();
}

// Keras's GlobalAveragePooling2D.get_config() (base_global_pooling.py).
std::vector<KerasKeySpec> keras_keys_global_average_pooling2d() {
  return {{"data_format", KerasKey::kChannelsLast}, {"keepdims", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
