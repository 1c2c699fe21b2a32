// See host_eltwise.h. erf from Abramowitz and Stegun's 7.1.26 (|error| <= 1.5e-7), written as its
// complement erfc(a) = p(t) t e^(-a^2), t = 1 / (1 + 0.3275911 a), a = |x| / sqrt 2, so that
// 1 + erf(z) is erfc(a) for z < 0 (no cancellation where GELU is near 0) and 2 - erfc(a) else;
// e^(-a^2) by host_lanes.h's exp_nonpositive. oneDNN's own gelu_erf ran at about 11 ns per
// 16-float vector forward and 21 backward on a Zen 5 core (a character GPT's MLP spent 11% of its
// step there); these loops run at about 9 ns both ways. This file is compiled with
// -ffp-contract=off, so every width computes the same operations (docs/design.md#sequences); the
// multiplies and adds that fuse are host_lanes.h's fused(), at every width.
#include "worker/nn/host_eltwise.h"

#include <algorithm>

#include "common/errors.h"
#include "worker/nn/host_lanes.h"

namespace dtrain::nn {
namespace {

using direct_conv::Vectors;

constexpr float kInverseSqrt2 = 0.70710678118654752f;
constexpr float kInverseSqrt2Pi = 0.39894228040143268f;

// erfc(a) for a >= 0, given e^(-a^2).
DT_INLINE float erfc_nonnegative(float a, float exp_minus_a2) {
  const float t = 1.0f / fused(0.3275911f, a, 1.0f);
  float p = 1.061405429f;
  p = fused(p, t, -1.453152027f);
  p = fused(p, t, 1.421413741f);
  p = fused(p, t, -0.284496736f);
  p = fused(p, t, 0.254829592f);
  return p * t * exp_minus_a2;
}

DT_INLINE void forward_body(const float* x, float* y, size_t count) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) {
    const float v = x[i], z = v * kInverseSqrt2, a = z < 0.0f ? -z : z;
    const float c = erfc_nonnegative(a, exp_nonpositive(-(a * a)));
    y[i] = (0.5f * v) * (z < 0.0f ? c : 2.0f - c);
  }
}

// gelu'(x) = (1 + erf(x / sqrt 2)) / 2 + x e^(-x^2 / 2) / sqrt(2 pi); e^(-x^2 / 2) is erfc's
// e^(-a^2).
DT_INLINE void backward_body(const float* x, const float* dy, float* dx, size_t count) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) {
    const float v = x[i], z = v * kInverseSqrt2, a = z < 0.0f ? -z : z;
    const float e = exp_nonpositive(-(a * a));
    const float c = erfc_nonnegative(a, e);
    dx[i] = dy[i] * fused(v * e, kInverseSqrt2Pi, 0.5f * (z < 0.0f ? c : 2.0f - c));
  }
}

// y = e^x * scale, x <= 0.
DT_INLINE void exp_scaled_body(const float* x, float scale, float* y, size_t count) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) y[i] = exp_nonpositive(x[i]) * scale;
}

struct Kernels {
  void (*forward)(const float*, float*, size_t);
  void (*backward)(const float*, const float*, float*, size_t);
  void (*exp_scaled)(const float*, float, float*, size_t);
};

// The three loops compiled for one vector width (TARGET: a function attribute, or none).
#define DT_ELTWISE_KERNELS(SUFFIX, TARGET)                                                  \
  TARGET void forward_##SUFFIX(const float* x, float* y, size_t count) {                    \
    forward_body(x, y, count);                                                              \
  }                                                                                         \
  TARGET void backward_##SUFFIX(const float* x, const float* dy, float* dx, size_t count) { \
    backward_body(x, dy, dx, count);                                                        \
  }                                                                                         \
  TARGET void exp_scaled_##SUFFIX(const float* x, float scale, float* y, size_t count) {    \
    exp_scaled_body(x, scale, y, count);                                                    \
  }                                                                                         \
  const Kernels kernels_##SUFFIX = {forward_##SUFFIX, backward_##SUFFIX, exp_scaled_##SUFFIX};

DT_ELTWISE_KERNELS(plain, )
#if defined(__x86_64__) && defined(__GNUC__)
DT_ELTWISE_KERNELS(avx2, __attribute__((target("avx2,fma"))))
DT_ELTWISE_KERNELS(avx512, __attribute__((target("avx512f"))))
#endif
#undef DT_ELTWISE_KERNELS

Kernels kernels_for(Vectors vectors) {
  if (vectors == Vectors::kWidest) vectors = direct_conv::widest();
  DT_ENFORCE(direct_conv::runs(vectors), "this CPU cannot run GELU's {} loops",
             direct_conv::vectors_name(vectors));
  switch (vectors) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx512:
      return kernels_avx512;
    case Vectors::kAvx2:
      return kernels_avx2;
#endif
    default:
      return kernels_plain;
  }
}

/// Floats per piece the threads share out: whole cache lines, enough to be worth a thread.
constexpr size_t kPiece = size_t{1} << 14;

}  // namespace

void host_gelu_forward(size_t count, const float* x, float* y, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const auto pieces = static_cast<int64_t>((count + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) if (pieces > 1)
  for (int64_t k = 0; k < pieces; ++k) {
    const size_t first = static_cast<size_t>(k) * kPiece;
    kernels.forward(x + first, y + first, std::min(kPiece, count - first));
  }
}

void host_gelu_backward(size_t count, const float* x, const float* dy, float* dx, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const auto pieces = static_cast<int64_t>((count + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) if (pieces > 1)
  for (int64_t k = 0; k < pieces; ++k) {
    const size_t first = static_cast<size_t>(k) * kPiece;
    kernels.backward(x + first, dy + first, dx + first, std::min(kPiece, count - first));
  }
}

void host_exp_scaled(size_t count, const float* x, float scale, float* y, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const auto pieces = static_cast<int64_t>((count + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) if (pieces > 1)
  for (int64_t k = 0; k < pieces; ++k) {
    const size_t first = static_cast<size_t>(k) * kPiece;
    kernels.exp_scaled(x + first, scale, y + first, std::min(kPiece, count - first));
  }
}

}  // namespace dtrain::nn
