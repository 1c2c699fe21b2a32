// See layer_keys.h.
#include "worker/nn/layers/layer_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "worker/nn/random.h"

namespace dtrain::nn::layers {

std::pair<int, int> int_or_pair(const common::JsonNode& node, int min, int max) {
  if (!node.is_array()) {
    int v = static_cast<int>(node.as_int(min, max));
    return {v, v};
  }
  std::vector<common::JsonNode> items = node.as_array();
  if (items.size() != 2)
    node.fail(fmt::format("expected an integer or a pair, found {}", node.describe()));
  return {static_cast<int>(items[0].as_int(min, max)), static_cast<int>(items[1].as_int(min, max))};
}

Activation parse_activation(const common::JsonNode& node) {
  if (node.is_null()) return Activation::kLinear;
  std::string name = node.as_string();
  if (name == "linear") return Activation::kLinear;
  if (name == "relu") return Activation::kRelu;
  if (name == "softmax") return Activation::kSoftmax;
  node.fail(
      fmt::format("activation \"{}\" is not supported (expected relu, softmax or linear)", name));
}

std::pair<int, int> same_padding(int in, int kernel, int stride) {
  int out = (in + stride - 1) / stride;
  int total = std::max((out - 1) * stride + kernel - in, 0);
  return {total / 2, total - total / 2};
}

void glorot_uniform(float* w, size_t count, int fan_in, int fan_out, uint64_t seed) {
  float limit = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
  for (size_t i = 0; i < count; ++i) w[i] = (2.0f * unit_float(random_key(seed, i)) - 1.0f) * limit;
}

Activated::Activated(Activation activation, Dims out, const LayerContext& c)
    : activation_(activation), out_(out) {
  if (activation_ == Activation::kRelu)
    delta_ = Buffer<float>(c.backend.device(), out.size() * static_cast<size_t>(c.max_batch));
}

const float* Activated::deactivate(Backend& b, int n, const float* y, const float* dy) {
  if (activation_ != Activation::kRelu) return dy;
  b.relu_backward(out_.size() * static_cast<size_t>(n), y, dy, delta_.data());
  return delta_.data();
}

}  // namespace dtrain::nn::layers
