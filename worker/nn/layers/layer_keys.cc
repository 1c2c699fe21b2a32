// See layer_keys.h.
#include "worker/nn/layers/layer_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

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

namespace {

struct InitializerName {
  Initializer init;
  const char* name;        ///< Keras's string form
  const char* class_name;  ///< Keras's class
};
constexpr InitializerName kInitializers[] = {
    {Initializer::kGlorotUniform, "glorot_uniform", "GlorotUniform"},
    {Initializer::kGlorotNormal, "glorot_normal", "GlorotNormal"},
    {Initializer::kHeNormal, "he_normal", "HeNormal"},
    {Initializer::kHeUniform, "he_uniform", "HeUniform"},
    {Initializer::kLecunNormal, "lecun_normal", "LecunNormal"},
    {Initializer::kLecunUniform, "lecun_uniform", "LecunUniform"}};

// A draw of the standard normal cut at +-2 (Keras's truncated_normal redraws outside), for
// element i: Box-Muller on counter-based draws, attempt after attempt.
float truncated_normal(uint64_t seed, size_t i) {
  for (uint64_t attempt = 0;; ++attempt) {
    double u1 = 1.0 - unit_float(random_key(seed, i, attempt, 1));  // in (0, 1]
    double u2 = unit_float(random_key(seed, i, attempt, 2));
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
    if (std::abs(z) <= 2.0) return static_cast<float>(z);
  }
}

}  // namespace

Initializer parse_initializer(const common::JsonNode& node) {
  std::string name;
  if (node.is_string()) {
    name = node.as_string();
    for (const InitializerName& i : kInitializers)
      if (name == i.name || name == i.class_name) return i.init;
  } else {
    node.check_keys({"module", "class_name", "config", "registered_name"});
    name = node.at("class_name").as_string();
    if (auto config = node.find("config")) {  // Keras 3: seed, input_axes, output_axes
      config->check_keys({"seed", "input_axes", "output_axes"});
      if (auto seed = config->find("seed"); seed && !seed->is_null())
        seed->as_int(INT64_MIN, INT64_MAX);
      for (const char* axes : {"input_axes", "output_axes"}) {
        if (auto n = config->find(axes); n && !n->is_null())
          n->fail("dtrain computes the kernel's own fans: null");
      }
    }
    for (const InitializerName& i : kInitializers)
      if (name == i.class_name) return i.init;
  }
  std::string known;
  for (const InitializerName& i : kInitializers)
    known += std::string(known.empty() ? "" : ", ") + i.name;
  node.fail(fmt::format("initializer {} is not supported (dtrain has {})", name, known));
}

void initialize_kernel(Initializer init, float* w, size_t count, int fan_in, int fan_out,
                       uint64_t seed) {
  double scale = 1.0, n = fan_in;  // lecun: fan_in, scale 1
  bool normal = false;
  switch (init) {
    case Initializer::kGlorotUniform:
      return glorot_uniform(w, count, fan_in, fan_out, seed);
    case Initializer::kGlorotNormal:
      n = (fan_in + fan_out) / 2.0, normal = true;
      break;
    case Initializer::kHeNormal:
      scale = 2.0, normal = true;
      break;
    case Initializer::kHeUniform:
      scale = 2.0;
      break;
    case Initializer::kLecunNormal:
      normal = true;
      break;
    case Initializer::kLecunUniform:
      break;
  }
  if (normal) {
    const double stddev = std::sqrt(scale / n) / 0.87962566103423978;
    for (size_t i = 0; i < count; ++i)
      w[i] = static_cast<float>(stddev * truncated_normal(seed, i));
    return;
  }
  const float limit = static_cast<float>(std::sqrt(3.0 * scale / n));
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
