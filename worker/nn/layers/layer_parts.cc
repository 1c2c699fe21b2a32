// See layer_parts.h.
#include "worker/nn/layers/layer_parts.h"

#include <cmath>
#include <cstdint>
#include <tuple>

#include "worker/nn/random.h"

namespace dtrain::nn::layers {

PoolShape pool_shape(const PoolKeys& k, const Dims& in) {
  PoolShape s;
  s.c = in.c, s.h = in.h, s.w = in.w;
  s.kh = k.pool_h, s.kw = k.pool_w, s.sh = k.stride_h, s.sw = k.stride_w;
  if (k.same) {
    std::tie(s.pad_top, s.pad_bottom) = same_padding(in.h, k.pool_h, k.stride_h);
    std::tie(s.pad_left, s.pad_right) = same_padding(in.w, k.pool_w, k.stride_w);
  }
  return s;
}

void glorot_uniform(float* w, size_t count, int fan_in, int fan_out, uint64_t seed) {
  float limit = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
  for (size_t i = 0; i < count; ++i) w[i] = (2.0f * unit_float(random_key(seed, i)) - 1.0f) * limit;
}

namespace {

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

void random_uniform(float* w, size_t count, UniformRange range, uint64_t seed) {
  const float width = range.maxval - range.minval;
  for (size_t i = 0; i < count; ++i) w[i] = range.minval + width * unit_float(random_key(seed, i));
}

Activated::Activated(Activation activation, Dims out, const LayerContext& c)
    : activation_(activation), out_(out) {
  eltwise_ = eltwise_of(activation, &f_);
  const size_t floats = out.size() * static_cast<size_t>(c.max_batch);
  if (activation_ == Activation::kRelu || eltwise_)
    delta_ = Buffer<float>(c.backend.device(), floats);
  if (eltwise_) pre_ = Buffer<float>(c.backend.device(), floats);
}

void Activated::activate(Backend& b, int n, float* y) {
  if (eltwise_) b.eltwise_forward(f_, out_.size() * static_cast<size_t>(n), pre_.data(), y);
}

const float* Activated::deactivate(Backend& b, int n, const float* y, const float* dy) {
  const size_t count = out_.size() * static_cast<size_t>(n);
  if (eltwise_) {
    b.eltwise_backward(f_, count, pre_.data(), dy, delta_.data());
    return delta_.data();
  }
  if (activation_ != Activation::kRelu) return dy;
  b.relu_backward(count, y, dy, delta_.data());
  return delta_.data();
}

}  // namespace dtrain::nn::layers
