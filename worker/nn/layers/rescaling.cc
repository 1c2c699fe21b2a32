// Keras's Rescaling: y = x * scale + offset, in training and inference alike; scale required,
// offset 0. Numbers only (Keras also takes a per-channel array: refused). Backward: dx = dy *
// scale.
#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class Rescaling : public Layer {
 public:
  Rescaling(float scale, float offset, Dims dims) : scale_(scale), offset_(offset), dims_(dims) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    b.scale_shift(dims_.size() * static_cast<size_t>(a.n), scale_, offset_, a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0])
      b.scale_shift(dims_.size() * static_cast<size_t>(a.n), scale_, 0.0f, a.dy, a.dx[0]);
  }

 private:
  float scale_, offset_;
  Dims dims_;
};

class RescalingConfig : public LayerConfig {
 public:
  RescalingConfig(float scale, float offset) : scale_(scale), offset_(offset) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override { return in[0]; }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<Rescaling>(scale_, offset_, in[0]);
  }

 private:
  float scale_, offset_;
};

float finite_number(const common::JsonNode& node) {
  if (node.is_array() || node.is_object())
    node.fail(fmt::format("expected a number (dtrain has no per-channel array), found {}",
                          node.describe()));
  return static_cast<float>(node.as_number(-3.4e38, 3.4e38));
}

}  // namespace

std::unique_ptr<LayerConfig> parse_rescaling(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "scale", "offset"});
  const float scale = finite_number(node.at("scale"));
  float offset = 0.0f;
  if (auto n = node.find("offset")) offset = finite_number(*n);
  return std::make_unique<RescalingConfig>(scale, offset);
}

// Keras's Rescaling.get_config() (keras/src/layers/preprocessing/rescaling.py).
std::vector<KerasKeySpec> keras_keys_rescaling() {
  return {{"scale", KerasKey::kRead}, {"offset", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
