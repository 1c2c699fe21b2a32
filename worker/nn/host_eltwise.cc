// See host_eltwise.h. erf from Abramowitz and Stegun's 7.1.26 (|error| <= 1.5e-7), written as its
// complement erfc(a) = p(t) t e^(-a^2), t = 1 / (1 + 0.3275911 a), a = |x| / sqrt 2, so that
// 1 + erf(z) is erfc(a) for z < 0 (no cancellation where GELU is near 0) and 2 - erfc(a) else;
// e^(-a^2) by host_lanes.h's exp_nonpositive. oneDNN's own gelu_erf ran at about 11 ns per
// 16-float vector forward and 21 backward on a Zen 5 core (a character GPT's MLP spent 11% of its
// step there); these loops run at about 9 ns both ways. This file is compiled with
// -ffp-contract=off, so every width computes the same operations (docs/design.md#sequences).
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
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t + -1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t + -0.284496736f;
  p = p * t + 0.254829592f;
  return p * t * exp_minus_a2;
}

DT_INLINE void forward_body(const float* x, float* y, size_t count) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) {
    const float v = x[i], z = v * kInverseSqrt2, a = z < 0.0f ? -z : z;
    const float c = erfc_nonnegative(a, exp_nonpositive(-(a * a)));
    y[i] = 0.5f * v * (z < 0.0f ? c : 2.0f - c);
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
    dx[i] = dy[i] * (0.5f * (z < 0.0f ? c : 2.0f - c) + v * e * kInverseSqrt2Pi);
  }
}

struct Kernels {
  void (*forward)(const float*, float*, size_t);
  void (*backward)(const float*, const float*, float*, size_t);
};

void forward_plain(const float* x, float* y, size_t count) {
  forward_body(x, y, count);
}
void backward_plain(const float* x, const float* dy, float* dx, size_t count) {
  backward_body(x, dy, dx, count);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void forward_avx2(const float* x, float* y, size_t count) {
  forward_body(x, y, count);
}
__attribute__((target("avx2"))) void backward_avx2(const float* x, const float* dy, float* dx,
                                                   size_t count) {
  backward_body(x, dy, dx, count);
}
__attribute__((target("avx512f"))) void forward_avx512(const float* x, float* y, size_t count) {
  forward_body(x, y, count);
}
__attribute__((target("avx512f"))) void backward_avx512(const float* x, const float* dy, float* dx,
                                                        size_t count) {
  backward_body(x, dy, dx, count);
}
#endif

Kernels kernels_for(Vectors vectors) {
  if (vectors == Vectors::kWidest) vectors = direct_conv::widest();
  DT_ENFORCE(direct_conv::runs(vectors), "this CPU cannot run GELU's {} loops",
             direct_conv::vectors_name(vectors));
  switch (vectors) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx512:
      return {forward_avx512, backward_avx512};
    case Vectors::kAvx2:
      return {forward_avx2, backward_avx2};
#endif
    default:
      return {forward_plain, backward_plain};
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

}  // namespace dtrain::nn
