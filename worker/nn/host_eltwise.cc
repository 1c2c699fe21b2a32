// See host_eltwise.h. erf from Abramowitz and Stegun's 7.1.26 (|error| <= 1.5e-7), written as its
// complement erfc(a) = p(t) t e^(-a^2), t = 1 / (1 + 0.3275911 a), a = |x| / sqrt 2, so that
// 1 + erf(z) is erfc(a) for z < 0 (no cancellation where GELU is near 0) and 2 - erfc(a) else;
// e^(-a^2) by host_lanes.h's exp_nonpositive. oneDNN's own gelu_erf ran at about 11 ns per
// 16-float vector forward and 21 backward on a Zen 5 core (a character GPT's MLP spent 11% of its
// step there); these loops at 9.6 and 11 ns, and with their multiplies and adds fused at 6.6
// and 7.3 ns, about what memory allows for a 4096 x 512 activation. This file is compiled with
// -ffp-contract=off, so every width computes the same operations (docs/design.md#sequences); the
// multiplies and adds that fuse are host_lanes.h's fused(), at every width.
#include "worker/nn/host_eltwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

/// One call's rows of host_softmax_cross_entropy.
struct LossRows {
  int classes;
  const float* logits;
  const int32_t* labels;
  float scale;
  float* dlogits;
  float* row_losses;
  uint8_t* row_hits;
};

// Rows [first, last): the largest logit (a maximum: any order gives it) and the first index that
// holds it; e = e^(x - top) (into the row's dlogits, or e, a thread's buffer of `classes`
// floats), summed by host_lanes.h's lane_sum; the row's log-probability of its
// label, x - top - log(sum); then dlogits = e * (scale / sum), less scale at the label.
DT_INLINE void loss_rows_body(const LossRows& l, int first, int last, float* e) {
  const int c = l.classes;
  for (int i = first; i < last; ++i) {
    const float* x = l.logits + static_cast<size_t>(i) * c;
    float* out = l.dlogits ? l.dlogits + static_cast<size_t>(i) * c : e;
    float top = x[0];
    for (int j = 1; j < c; ++j) top = top < x[j] ? x[j] : top;
    int best = 0;
    while (best < c && !(x[best] == top)) ++best;
    if (best == c) best = 0;  // every logit NaN
#pragma omp simd
    for (int j = 0; j < c; ++j) out[j] = exp_nonpositive(x[j] - top);
    const float sum = lane_sum(out, c);
    const int label = l.labels[i];
    l.row_losses[i] = x[label] - top - std::log(sum);
    l.row_hits[i] = best == label ? 1 : 0;
    if (!l.dlogits) continue;
    const float factor = l.scale / sum;
#pragma omp simd
    for (int k = 0; k < c; ++k) out[k] *= factor;
    out[label] -= l.scale;
  }
}

struct Kernels {
  void (*forward)(const float*, float*, size_t);
  void (*backward)(const float*, const float*, float*, size_t);
  void (*loss_rows)(const LossRows&, int, int, float*);
};

// The loops compiled for one vector width (TARGET: a function attribute, or none).
#define DT_ELTWISE_KERNELS(SUFFIX, TARGET)                                                  \
  TARGET void forward_##SUFFIX(const float* x, float* y, size_t count) {                    \
    forward_body(x, y, count);                                                              \
  }                                                                                         \
  TARGET void backward_##SUFFIX(const float* x, const float* dy, float* dx, size_t count) { \
    backward_body(x, dy, dx, count);                                                        \
  }                                                                                         \
  TARGET void loss_rows_##SUFFIX(const LossRows& l, int first, int last, float* e) {        \
    loss_rows_body(l, first, last, e);                                                      \
  }                                                                                         \
  const Kernels kernels_##SUFFIX = {forward_##SUFFIX, backward_##SUFFIX, loss_rows_##SUFFIX};

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

void host_softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                                float scale, float* dlogits, float* row_losses, uint8_t* row_hits,
                                Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const LossRows l{classes, logits, labels, scale, dlogits, row_losses, row_hits};
  constexpr int kRows = 64;  // rows per task
  const int tasks = (n + kRows - 1) / kRows;
#pragma omp parallel if (static_cast <int64_t>(n) * classes >= (1 << 16))
  {
    std::vector<float> e(dlogits ? 0 : static_cast<size_t>(classes));
#pragma omp for schedule(static)
    for (int k = 0; k < tasks; ++k)
      kernels.loss_rows(l, k * kRows, std::min(n, (k + 1) * kRows), e.data());
  }
}

}  // namespace dtrain::nn
