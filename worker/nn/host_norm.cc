// See host_norm.h. Each channel's loops are compiled for AVX-512, AVX2 and plain x86-64 (the
// build itself targets plain x86-64, whose two double lanes made these passes a fifth of a ResNet
// step), picked at run time as direct_conv.h's are. This file is compiled with
// -ffp-contract=off, so no width fuses a multiply and an add that another does not: every width
// computes the same operations in the same order, and the results are the same bits
// (docs/design.md#batch-normalization).
#include "worker/nn/host_norm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "worker/nn/avx512_bf16.h"
#include "worker/nn/bf16_rounding.h"
#include "worker/nn/host_lanes.h"

namespace dtrain::nn {
namespace {

using direct_conv::Vectors;

// Channel ch's block of example i.
DT_INLINE size_t at(const NormShape& s, int i, int ch) {
  return (static_cast<size_t>(i) * s.c + ch) * static_cast<size_t>(s.hw);
}

// y = x * scale + shift over channel ch, for every example (with s.relu, max of that and 0).
DT_INLINE void affine(const NormShape& s, int ch, const float* x, float scale, float shift,
                      float* y) {
  for (int i = 0; i < s.n; ++i) {
    const float* xi = x + at(s, i, ch);
    float* yi = y + at(s, i, ch);
    if (s.relu) {
#pragma omp simd
      for (int p = 0; p < s.hw; ++p) {
        float v = xi[p] * scale + shift;
        yi[p] = v > 0.0f ? v : 0.0f;
      }
    } else {
#pragma omp simd
      for (int p = 0; p < s.hw; ++p) yi[p] = xi[p] * scale + shift;
    }
  }
}

// gamma / sqrt(var + epsilon) and beta - mean * that, as Keras's batch_normalization folds them.
DT_INLINE void folded(float epsilon, const float* gamma, const float* beta, float mean, float var,
                      int ch, float* scale, float* shift) {
  float inv = 1.0f / std::sqrt(var + epsilon);
  *scale = gamma ? gamma[ch] * inv : inv;
  *shift = (beta ? beta[ch] : 0.0f) - mean * *scale;
}

/// One training forward's arguments, for every channel.
struct Forward {
  const NormShape& s;
  float epsilon;
  const float* x;
  const float* gamma;
  const float* beta;
  float* y;
  float* mean;
  float* var;
};

DT_INLINE void forward_channel_body(const Forward& f, int ch) {
  const NormShape& s = f.s;
  const double m = static_cast<double>(s.n) * s.hw;
  Lanes sum;
  for (int i = 0; i < s.n; ++i) sum.add(f.x + at(s, i, ch), s.hw);
  const double mu = sum.total() / m;
  Lanes squares;
  for (int i = 0; i < s.n; ++i) squares.add_squared_deviations(f.x + at(s, i, ch), s.hw, mu);
  f.mean[ch] = static_cast<float>(mu);
  f.var[ch] = static_cast<float>(squares.total() / m);
  float scale, shift;
  folded(f.epsilon, f.gamma, f.beta, f.mean[ch], f.var[ch], ch, &scale, &shift);
  affine(s, ch, f.x, scale, shift, f.y);
}

/// One inference forward's arguments.
struct Inference {
  const NormShape& s;
  float epsilon;
  const float* x;
  const float* gamma;
  const float* beta;
  const float* mean;
  const float* var;
  float* y;
};

DT_INLINE void inference_channel_body(const Inference& f, int ch) {
  float scale, shift;
  folded(f.epsilon, f.gamma, f.beta, f.mean[ch], f.var[ch], ch, &scale, &shift);
  affine(f.s, ch, f.x, scale, shift, f.y);
}

/// One backward's arguments; masked is the calling thread's buffer of n x hw floats (s.relu).
/// totals and count: batchnorm_backward_data's sums over the whole batch (null, 0: this batch's).
struct Backward {
  const NormShape& s;
  float epsilon;
  const float* x;
  const float* y;
  const float* dy;
  const float* gamma;
  const float* mean;
  const float* var;
  float* dx;
  float* dgamma;
  float* dbeta;
  const float* totals = nullptr;
  double count = 0;
};

/// Channel ch's dy, example by example: row i starts at first + i * stride.
struct Rows {
  const float* first;
  size_t stride;
  const float* row(int i) const { return first + static_cast<size_t>(i) * stride; }
};

/// Channel ch's dy; with a fused ReLU, masked where y is not positive, once, into the thread's
/// buffer that the passes after read (a plain select the compiler vectorizes).
DT_INLINE Rows channel_dy(const Backward& b, int ch, float* masked) {
  const NormShape& s = b.s;
  if (!s.relu) return {b.dy + at(s, 0, ch), static_cast<size_t>(s.c) * s.hw};
  for (int i = 0; i < s.n; ++i) {
    const float* dyi = b.dy + at(s, i, ch);
    const float* yi = b.y + at(s, i, ch);
    float* r = masked + static_cast<size_t>(i) * s.hw;
#pragma omp simd
    for (int p = 0; p < s.hw; ++p) {
      const float d = dyi[p], v = yi[p];  // both read, so the select needs no branch
      r[p] = v > 0.0f ? d : 0.0f;
    }
  }
  return {masked, static_cast<size_t>(s.hw)};
}

/// dx of channel ch from the sums of dy and dy * xhat over m values.
DT_INLINE void channel_dx(const Backward& b, int ch, Rows dy, double total_dy, double total_dy_xhat,
                          double m) {
  const NormShape& s = b.s;
  const double mu = b.mean[ch], inv = 1.0 / std::sqrt(static_cast<double>(b.var[ch]) + b.epsilon);
  const double g = (b.gamma ? b.gamma[ch] : 1.0) * inv;
  const double mean_dy = total_dy / m, mean_dy_xhat = total_dy_xhat / m;
  for (int i = 0; i < s.n; ++i) {
    const float* xi = b.x + at(s, i, ch);
    const float* dyi = dy.row(i);
    float* dxi = b.dx + at(s, i, ch);
#pragma omp simd
    for (int p = 0; p < s.hw; ++p) {
      double xhat = (xi[p] - mu) * inv;
      dxi[p] = static_cast<float>(g * (dyi[p] - mean_dy - xhat * mean_dy_xhat));
    }
  }
}

DT_INLINE void backward_channel_body(const Backward& b, int ch, float* masked) {
  const NormShape& s = b.s;
  const double mu = b.mean[ch], inv = 1.0 / std::sqrt(static_cast<double>(b.var[ch]) + b.epsilon);
  const Rows dy = channel_dy(b, ch, masked);
  Lanes sum_dy, sum_dy_xhat;
  for (int i = 0; i < s.n; ++i) {
    sum_dy.add(dy.row(i), s.hw);
    sum_dy_xhat.add_products(dy.row(i), b.x + at(s, i, ch), s.hw, mu, inv);
  }
  const double total_dy = sum_dy.total(), total_dy_xhat = sum_dy_xhat.total();
  if (b.dbeta) b.dbeta[ch] = static_cast<float>(total_dy);
  if (b.dgamma) b.dgamma[ch] = static_cast<float>(total_dy_xhat);
  if (b.dx) channel_dx(b, ch, dy, total_dy, total_dy_xhat, static_cast<double>(s.n) * s.hw);
}

DT_INLINE void backward_data_channel_body(const Backward& b, int ch, float* masked) {
  channel_dx(b, ch, channel_dy(b, ch, masked), b.totals[ch], b.totals[b.s.c + ch], b.count);
}

/// batchnorm_sums' arguments.
struct Sums {
  const NormShape& s;
  const float* x;
  const float* center;
  float* sums;
};

DT_INLINE void sums_channel_body(const Sums& f, int ch) {
  const NormShape& s = f.s;
  Lanes lanes;
  if (f.center) {
    for (int i = 0; i < s.n; ++i)
      lanes.add_squared_deviations(f.x + at(s, i, ch), s.hw, f.center[ch]);
  } else {
    for (int i = 0; i < s.n; ++i) lanes.add(f.x + at(s, i, ch), s.hw);
  }
  f.sums[ch] = static_cast<float>(lanes.total());
}

/// The channel loops compiled for one vector width.
struct Kernels {
  void (*forward)(const Forward&, int);
  void (*inference)(const Inference&, int);
  void (*backward)(const Backward&, int, float*);
  void (*backward_data)(const Backward&, int, float*);
  void (*sums)(const Sums&, int);
};

void forward_plain(const Forward& f, int ch) {
  forward_channel_body(f, ch);
}
void inference_plain(const Inference& f, int ch) {
  inference_channel_body(f, ch);
}
void backward_plain(const Backward& b, int ch, float* masked) {
  backward_channel_body(b, ch, masked);
}
void backward_data_plain(const Backward& b, int ch, float* masked) {
  backward_data_channel_body(b, ch, masked);
}
void sums_plain(const Sums& f, int ch) {
  sums_channel_body(f, ch);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void forward_avx2(const Forward& f, int ch) {
  forward_channel_body(f, ch);
}
__attribute__((target("avx2"))) void inference_avx2(const Inference& f, int ch) {
  inference_channel_body(f, ch);
}
__attribute__((target("avx2"))) void backward_avx2(const Backward& b, int ch, float* masked) {
  backward_channel_body(b, ch, masked);
}
__attribute__((target("avx2"))) void backward_data_avx2(const Backward& b, int ch, float* masked) {
  backward_data_channel_body(b, ch, masked);
}
__attribute__((target("avx2"))) void sums_avx2(const Sums& f, int ch) {
  sums_channel_body(f, ch);
}
__attribute__((target("avx512f"))) void forward_avx512(const Forward& f, int ch) {
  forward_channel_body(f, ch);
}
__attribute__((target("avx512f"))) void inference_avx512(const Inference& f, int ch) {
  inference_channel_body(f, ch);
}
__attribute__((target("avx512f"))) void backward_avx512(const Backward& b, int ch, float* masked) {
  backward_channel_body(b, ch, masked);
}
__attribute__((target("avx512f"))) void backward_data_avx512(const Backward& b, int ch,
                                                             float* masked) {
  backward_data_channel_body(b, ch, masked);
}
__attribute__((target("avx512f"))) void sums_avx512(const Sums& f, int ch) {
  sums_channel_body(f, ch);
}
#endif

/// The width asked for (kWidest: the widest this CPU runs), checked to run here.
Vectors runnable(Vectors vectors) {
  if (vectors == Vectors::kWidest) vectors = direct_conv::widest();
  DT_ENFORCE(direct_conv::runs(vectors), "this CPU cannot run batch normalization's {} loops",
             direct_conv::vectors_name(vectors));
  return vectors;
}

Kernels kernels_for(Vectors vectors) {
  switch (runnable(vectors)) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx512:
      return {forward_avx512, inference_avx512, backward_avx512, backward_data_avx512, sums_avx512};
    case Vectors::kAvx2:
      return {forward_avx2, inference_avx2, backward_avx2, backward_data_avx2, sums_avx2};
#endif
    default:
      return {forward_plain, inference_plain, backward_plain, backward_data_plain, sums_plain};
  }
}

// Blocks of channels (NormShape::layout kBlocked, docs/design.md#blocked-activations): a unit is
// one example's block of kChannelBlock channels, hw pixels of kChannelBlock floats each, the
// channels in vector lanes. Each channel of a unit is summed over chunks of kChunk pixels in
// float (the even pixels and the odd ones apart, two chains added at the chunk's end), and the
// chunks in double; each channel's units are then added in double in example order. The threads
// take whole units, so the order is the code's at every thread count and width. The per-pixel
// work is float (half the vector operations of double, and no conversions): these passes are
// bound by memory once it is (docs/design.md#batch-normalization).
constexpr int kBlock = kChannelBlock;
constexpr int kChunk = 32;

DT_INLINE size_t unit_at(int u, int hw) {
  return static_cast<size_t>(u) * hw * kBlock;
}

/// Pixels [p, end) of a unit: sum[k] += the chunk's float total of term(pixel pointer, k), where
/// term reads the pixel's 16 values; the even and odd pixels in two float chains.
template <typename Term>
DT_INLINE void chunk_sums(int p, int end, const Term& term, double* sum) {
  float even[kBlock] = {}, odd[kBlock] = {};
  for (; p + 2 <= end; p += 2) {
    const size_t at = static_cast<size_t>(p) * kBlock;
#pragma omp simd
    for (int k = 0; k < kBlock; ++k) {
      even[k] += term(at, k);
      odd[k] += term(at + kBlock, k);
    }
  }
  if (p < end) {
    const size_t at = static_cast<size_t>(p) * kBlock;
#pragma omp simd
    for (int k = 0; k < kBlock; ++k) even[k] += term(at, k);
  }
#pragma omp simd
  for (int k = 0; k < kBlock; ++k) sum[k] += static_cast<double>(even[k] + odd[k]);
}

/// sum[k] (zeroed first) = the unit's sum of term over its pixels, chunk by chunk.
template <typename Term>
DT_INLINE void unit_total(int hw, const Term& term, double* sum) {
  for (int k = 0; k < kBlock; ++k) sum[k] = 0;
  for (int p = 0; p < hw; p += kChunk) chunk_sums(p, p + kChunk < hw ? p + kChunk : hw, term, sum);
}

/// out[k] = the sum over the unit's pixels of x (center null) or of (x - center[k])^2.
DT_INLINE void unit_sums_body(const float* x, int hw, const float* center, double* out) {
  if (center) {
    unit_total(
        hw,
        [&](size_t at, int k) {
          const float d = x[at + k] - center[k];
          return d * d;
        },
        out);
  } else {
    unit_total(
        hw, [&](size_t at, int k) { return x[at + k]; }, out);
  }
}

/// v as bf16 bits, as AVX512_BF16's conversion gives them (bf16_rounding.h): rounded to nearest
/// even, a subnormal to a zero of its sign, a NaN quieted. In integer operations with the selects
/// as masks, which the compiler vectorizes at every width: a rounded copy written in the pass
/// that writes the value (docs/design.md#rounded-copies).
DT_INLINE uint16_t bf16_bits(float v) {
  uint32_t b;
  __builtin_memcpy(&b, &v, sizeof b);
  const uint32_t nearest = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  const uint32_t zero = (b >> 16) & 0x8000u, quiet = (b >> 16) | 0x40u;
  const uint32_t subnormal = 0u - static_cast<uint32_t>((b & 0x7f800000u) == 0);
  const uint32_t nan = 0u - static_cast<uint32_t>((b & 0x7fffffffu) > 0x7f800000u);
  const uint32_t r = (((nearest & ~subnormal) | (zero & subnormal)) & ~nan) | (quiet & nan);
  return static_cast<uint16_t>(r);
}

/// y = x * scale[k] + shift[k] over the unit, then + addend (kAdd), then (kRelu) max of that
/// and 0: the float operations of the normalization, then of Add's add_forward; and (kRound)
/// y's rounded copy into y16; without kFloat, only the copy (NormShape::rounded_only).
template <bool kAdd, bool kRelu, bool kRound, bool kFloat = true>
DT_INLINE void unit_affine_pass(const float* x, const float* addend, int hw, const float* scale_in,
                                const float* shift_in, float* y, uint16_t* y16) {
  // Local copies, as in unit_backward_sums_body: the stores to y may not alias them.
  float scale[kBlock], shift[kBlock];
  for (int k = 0; k < kBlock; ++k) {
    scale[k] = scale_in[k];
    shift[k] = shift_in[k];
  }
  for (int p = 0; p < hw; ++p) {
    const size_t at = static_cast<size_t>(p) * kBlock;
#pragma omp simd
    for (int k = 0; k < kBlock; ++k) {
      float v = x[at + k] * scale[k] + shift[k];
      if (kAdd) v = v + addend[at + k];
      const float out = kRelu ? (v > 0.0f ? v : 0.0f) : v;
      if (kFloat) y[at + k] = out;
      if (kRound) y16[at + k] = bf16_bits(out);
    }
  }
}

/// unit_affine_pass, with addend where it is not null, the copy where y16 is not.
template <bool kRound, bool kFloat = true>
DT_INLINE void unit_affine_rounding(const float* x, const float* addend, int hw, const float* scale,
                                    const float* shift, bool relu, float* y, uint16_t* y16) {
  if (addend && relu)
    return unit_affine_pass<true, true, kRound, kFloat>(x, addend, hw, scale, shift, y, y16);
  if (addend)
    return unit_affine_pass<true, false, kRound, kFloat>(x, addend, hw, scale, shift, y, y16);
  if (relu)
    return unit_affine_pass<false, true, kRound, kFloat>(x, addend, hw, scale, shift, y, y16);
  unit_affine_pass<false, false, kRound, kFloat>(x, addend, hw, scale, shift, y, y16);
}
DT_INLINE void unit_affine_body(const float* x, const float* addend, int hw, const float* scale,
                                const float* shift, bool relu, float* y, uint16_t* y16) {
  // A null y: the copy alone (NormShape::rounded_only).
  if (y16 && !y)
    return unit_affine_rounding<true, false>(x, addend, hw, scale, shift, relu, y, y16);
  if (y16) return unit_affine_rounding<true>(x, addend, hw, scale, shift, relu, y, y16);
  unit_affine_rounding<false>(x, addend, hw, scale, shift, relu, y, y16);
}

/// Where a fused ReLU's mask comes from: none (no ReLU), the forward's output y (y > 0), or x
/// itself through the forward's own scale and shift (x * scale + shift > 0: the same float
/// operations as the forward's, so the same mask, without reading y).
enum MaskFrom { kNoMask, kFromY, kFromX };
struct UnitMask {
  const float* scale = nullptr;  ///< kFromX: the unit's 16 channels' scale and shift
  const float* shift = nullptr;
};

/// m's scale and shift copied into the caller's arrays (when it has them).
DT_INLINE UnitMask local_mask(const UnitMask& m, float* scale, float* shift) {
  if (!m.scale) return m;
  for (int k = 0; k < kBlock; ++k) {
    scale[k] = m.scale[k];
    shift[k] = m.shift[k];
  }
  return {scale, shift};
}

/// Where the unit's pixel at `at` of y starts when the mask reads y; null otherwise (y may be
/// null then: a forward that wrote only its copy, NormShape::rounded_only).
template <int kMask>
DT_INLINE const float* y_at(const float* y, size_t at) {
  return kMask == kFromY ? y + at : nullptr;
}

/// dy, or +0 where the ReLU's output is 0: the select as a mask of dy's bits, which the compiler
/// vectorizes in these loops where it branched on a plain select.
/// Element i of a pixel pair (x, y and dy at the same offset), of channel c of the unit.
template <int kMask>
DT_INLINE float masked(float dy, const float* y, const float* x, const UnitMask& m, int i, int c) {
  if (kMask == kNoMask) return dy;
  const float v = kMask == kFromY ? y[i] : x[i] * m.scale[c] + m.shift[c];
  uint32_t bits;
  __builtin_memcpy(&bits, &dy, sizeof bits);
  bits &= 0u - static_cast<uint32_t>(v > 0.0f);
  float d;
  __builtin_memcpy(&d, &bits, sizeof d);
  return d;
}

/// The unit's sums of dy and of dy * xhat (dy masked by the ReLU's output, kMask), xhat = (x -
/// mu) * inv in float, ordered as unit_sums_body orders its sums.
template <int kMask>
DT_INLINE void unit_backward_sums_body(const float* x, const float* y, const float* dy, int hw,
                                       const UnitMask& m, const float* mu_in, const float* inv_in,
                                       double* sum_dy, double* sum_dy_xhat) {
  // Local copies: the loops then keep them in registers, as nothing they store may alias them.
  float mu[kBlock], inv[kBlock], scale[kBlock], shift[kBlock];
  const UnitMask mask = local_mask(m, scale, shift);
  for (int k = 0; k < kBlock; ++k) {
    mu[k] = mu_in[k];
    inv[k] = inv_in[k];
    sum_dy[k] = sum_dy_xhat[k] = 0;
  }
  for (int p = 0; p < hw; p += kChunk) {
    const int end = p + kChunk < hw ? p + kChunk : hw;
    float dy_even[kBlock] = {}, dy_odd[kBlock] = {}, xh_even[kBlock] = {}, xh_odd[kBlock] = {};
    int q = p;
    for (; q + 2 <= end; q += 2) {
      const size_t at = static_cast<size_t>(q) * kBlock;
#pragma omp simd
      for (int k = 0; k < kBlock; ++k) {
        const float d = masked<kMask>(dy[at + k], y_at<kMask>(y, at), x + at, mask, k, k);
        const float e =
            masked<kMask>(dy[at + kBlock + k], y_at<kMask>(y, at), x + at, mask, kBlock + k, k);
        dy_even[k] += d;
        dy_odd[k] += e;
        xh_even[k] += d * ((x[at + k] - mu[k]) * inv[k]);
        xh_odd[k] += e * ((x[at + kBlock + k] - mu[k]) * inv[k]);
      }
    }
    if (q < end) {
      const size_t at = static_cast<size_t>(q) * kBlock;
#pragma omp simd
      for (int k = 0; k < kBlock; ++k) {
        const float d = masked<kMask>(dy[at + k], y_at<kMask>(y, at), x + at, mask, k, k);
        dy_even[k] += d;
        xh_even[k] += d * ((x[at + k] - mu[k]) * inv[k]);
      }
    }
#pragma omp simd
    for (int k = 0; k < kBlock; ++k) {
      sum_dy[k] += static_cast<double>(dy_even[k] + dy_odd[k]);
      sum_dy_xhat[k] += static_cast<double>(xh_even[k] + xh_odd[k]);
    }
  }
}

/// Per channel k of a unit, in float: mu, inv, g = gamma * inv, and the means of dy and
/// dy * xhat.
struct UnitGradient {
  const float* mu;
  const float* inv;
  const float* g;
  const float* mean_dy;
  const float* mean_dy_xhat;
};

/// dx over the unit, as channel_dx computes each value but in float; and (kRound) its rounded
/// copy into dx16; without kFloat, only the copy (NormShape::rounded_only).
template <int kMask, bool kRound, bool kFloat>
DT_INLINE void unit_dx_pass(const float* x, const float* y, const float* dy, int hw,
                            const UnitMask& m, const UnitGradient& u, float* dx, uint16_t* dx16) {
  // Local copies, as in unit_backward_sums_body: the stores to dx may not alias them.
  float mu[kBlock], inv[kBlock], g[kBlock], mean_dy[kBlock], mean_dy_xhat[kBlock], scale[kBlock],
      shift[kBlock];
  const UnitMask mask = local_mask(m, scale, shift);
  for (int k = 0; k < kBlock; ++k) {
    mu[k] = u.mu[k];
    inv[k] = u.inv[k];
    g[k] = u.g[k];
    mean_dy[k] = u.mean_dy[k];
    mean_dy_xhat[k] = u.mean_dy_xhat[k];
  }
  for (int p = 0; p < hw; ++p) {
    const size_t at = static_cast<size_t>(p) * kBlock;
#pragma omp simd
    for (int k = 0; k < kBlock; ++k) {
      const float d = masked<kMask>(dy[at + k], y_at<kMask>(y, at), x + at, mask, k, k);
      const float xhat = (x[at + k] - mu[k]) * inv[k];
      const float out = g[k] * (d - mean_dy[k] - xhat * mean_dy_xhat[k]);
      if (kFloat) dx[at + k] = out;
      if (kRound) dx16[at + k] = bf16_bits(out);
    }
  }
}

template <int kMask>
DT_INLINE void unit_dx_body(const float* x, const float* y, const float* dy, int hw,
                            const UnitMask& m, const UnitGradient& u, float* dx, uint16_t* dx16) {
  if (dx16 && !dx) return unit_dx_pass<kMask, true, false>(x, y, dy, hw, m, u, dx, dx16);
  if (dx16) return unit_dx_pass<kMask, true, true>(x, y, dy, hw, m, u, dx, dx16);
  unit_dx_pass<kMask, false, true>(x, y, dy, hw, m, u, dx, dx16);
}

/// The unit loops compiled for one vector width.
struct UnitKernels {
  void (*sums)(const float*, int, const float*, double*);
  void (*affine)(const float*, const float*, int, const float*, const float*, bool, float*,
                 uint16_t*);
  void (*backward_sums)(const float*, const float*, const float*, int, int, const UnitMask&,
                        const float*, const float*, double*, double*);
  void (*dx)(const float*, const float*, const float*, int, int, const UnitMask&,
             const UnitGradient&, float*, uint16_t*);
};

#define DT_UNIT_KERNELS(suffix, attribute)                                                         \
  attribute void unit_sums_##suffix(const float* x, int hw, const float* center, double* out) {    \
    unit_sums_body(x, hw, center, out);                                                            \
  }                                                                                                \
  attribute void unit_affine_##suffix(const float* x, const float* addend, int hw,                 \
                                      const float* scale, const float* shift, bool relu, float* y, \
                                      uint16_t* y16) {                                             \
    unit_affine_body(x, addend, hw, scale, shift, relu, y, y16);                                   \
  }                                                                                                \
  attribute void unit_backward_sums_##suffix(                                                      \
      const float* x, const float* y, const float* dy, int hw, int from, const UnitMask& m,        \
      const float* mu, const float* inv, double* sum_dy, double* sum_dy_xhat) {                    \
    if (from == kFromY)                                                                            \
      return unit_backward_sums_body<kFromY>(x, y, dy, hw, m, mu, inv, sum_dy, sum_dy_xhat);       \
    if (from == kFromX)                                                                            \
      return unit_backward_sums_body<kFromX>(x, y, dy, hw, m, mu, inv, sum_dy, sum_dy_xhat);       \
    unit_backward_sums_body<kNoMask>(x, y, dy, hw, m, mu, inv, sum_dy, sum_dy_xhat);               \
  }                                                                                                \
  attribute void unit_dx_##suffix(const float* x, const float* y, const float* dy, int hw,         \
                                  int from, const UnitMask& m, const UnitGradient& u, float* dx,   \
                                  uint16_t* dx16) {                                                \
    if (from == kFromY) return unit_dx_body<kFromY>(x, y, dy, hw, m, u, dx, dx16);                 \
    if (from == kFromX) return unit_dx_body<kFromX>(x, y, dy, hw, m, u, dx, dx16);                 \
    unit_dx_body<kNoMask>(x, y, dy, hw, m, u, dx, dx16);                                           \
  }

DT_UNIT_KERNELS(plain, )
#if defined(__x86_64__) && defined(__GNUC__)
DT_UNIT_KERNELS(avx2, __attribute__((target("avx2"))))
DT_UNIT_KERNELS(avx512, __attribute__((target("avx512f"))))
#endif
#undef DT_UNIT_KERNELS

#if defined(__x86_64__) && defined(__GNUC__)
// The passes that write a rounded copy, at the widest width where the CPU has AVX512_BF16: one
// unit's 16 channels are one vector, each float operation of the generic loops is one
// instruction (a multiply and an add apart, max(v, 0) as v > 0 ? v : 0 is: the same bits), and
// the copy is the conversion instruction's, in the same pass without a loop of integer operations.
DT_AVX512_INTRINSICS_BEGIN

template <bool kAdd, bool kRelu, bool kFloat = true>
DT_TARGET_AVX512_BF16 void unit_affine_bf16_pass(const float* x, const float* addend, int hw,
                                                 const float* scale, const float* shift, float* y,
                                                 uint16_t* y16) {
  const __m512 a = _mm512_loadu_ps(scale), b = _mm512_loadu_ps(shift), zero = _mm512_setzero_ps();
  for (int p = 0; p < hw; ++p) {
    const size_t at = static_cast<size_t>(p) * kBlock;
    __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + at), a), b);
    if (kAdd) v = _mm512_add_ps(v, _mm512_loadu_ps(addend + at));
    if (kRelu) v = _mm512_max_ps(v, zero);  // v > 0 ? v : 0, NaN and -0 included
    if (kFloat) _mm512_storeu_ps(y + at, v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y16 + at),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
}

template <bool kFloat>
DT_TARGET_AVX512_BF16 void unit_affine_bf16_with(const float* x, const float* addend, int hw,
                                                 const float* scale, const float* shift, bool relu,
                                                 float* y, uint16_t* y16) {
  if (addend && relu)
    return unit_affine_bf16_pass<true, true, kFloat>(x, addend, hw, scale, shift, y, y16);
  if (addend)
    return unit_affine_bf16_pass<true, false, kFloat>(x, addend, hw, scale, shift, y, y16);
  if (relu) return unit_affine_bf16_pass<false, true, kFloat>(x, addend, hw, scale, shift, y, y16);
  unit_affine_bf16_pass<false, false, kFloat>(x, addend, hw, scale, shift, y, y16);
}

DT_TARGET_AVX512_BF16 void unit_affine_bf16(const float* x, const float* addend, int hw,
                                            const float* scale, const float* shift, bool relu,
                                            float* y, uint16_t* y16) {
  // A null y: the copy alone (NormShape::rounded_only).
  if (!y) return unit_affine_bf16_with<false>(x, addend, hw, scale, shift, relu, y, y16);
  unit_affine_bf16_with<true>(x, addend, hw, scale, shift, relu, y, y16);
}

template <int kMask, bool kFloat>
DT_TARGET_AVX512_BF16 void unit_dx_bf16_pass(const float* x, const float* y, const float* dy,
                                             int hw, const UnitMask& m, const UnitGradient& u,
                                             float* dx, uint16_t* dx16) {
  const __m512 zero = _mm512_setzero_ps(), mu = _mm512_loadu_ps(u.mu), inv = _mm512_loadu_ps(u.inv),
               g = _mm512_loadu_ps(u.g), mean_dy = _mm512_loadu_ps(u.mean_dy),
               mean_dy_xhat = _mm512_loadu_ps(u.mean_dy_xhat);
  const __m512 scale = kMask == kFromX ? _mm512_loadu_ps(m.scale) : zero,
               shift = kMask == kFromX ? _mm512_loadu_ps(m.shift) : zero;
  for (int p = 0; p < hw; ++p) {
    const size_t at = static_cast<size_t>(p) * kBlock;
    const __m512 xv = _mm512_loadu_ps(x + at);
    __m512 d = _mm512_loadu_ps(dy + at);
    if (kMask != kNoMask) {  // dy where the ReLU's output is positive, else +0 (masked())
      const __m512 out = kMask == kFromY ? _mm512_loadu_ps(y + at)
                                         : _mm512_add_ps(_mm512_mul_ps(xv, scale), shift);
      d = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(out, zero, _CMP_GT_OQ), d);
    }
    const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(xv, mu), inv);
    const __m512 v = _mm512_mul_ps(
        g, _mm512_sub_ps(_mm512_sub_ps(d, mean_dy), _mm512_mul_ps(xhat, mean_dy_xhat)));
    if (kFloat) _mm512_storeu_ps(dx + at, v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dx16 + at),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
}

DT_TARGET_AVX512_BF16 void unit_dx_bf16(const float* x, const float* y, const float* dy, int hw,
                                        int from, const UnitMask& m, const UnitGradient& u,
                                        float* dx, uint16_t* dx16) {
  if (!dx) {  // the copy alone (NormShape::rounded_only)
    if (from == kFromY) return unit_dx_bf16_pass<kFromY, false>(x, y, dy, hw, m, u, dx, dx16);
    if (from == kFromX) return unit_dx_bf16_pass<kFromX, false>(x, y, dy, hw, m, u, dx, dx16);
    return unit_dx_bf16_pass<kNoMask, false>(x, y, dy, hw, m, u, dx, dx16);
  }
  if (from == kFromY) return unit_dx_bf16_pass<kFromY, true>(x, y, dy, hw, m, u, dx, dx16);
  if (from == kFromX) return unit_dx_bf16_pass<kFromX, true>(x, y, dy, hw, m, u, dx, dx16);
  unit_dx_bf16_pass<kNoMask, true>(x, y, dy, hw, m, u, dx, dx16);
}
DT_AVX512_INTRINSICS_END
#endif

UnitKernels unit_kernels_for(Vectors vectors);

/// The loops that write a rounded copy: unit_affine_bf16 and unit_dx_bf16 at the widest width
/// where the CPU has AVX512_BF16, else the width's own (bf16_bits).
UnitKernels rounding_kernels_for(Vectors vectors) {
  UnitKernels kernels = unit_kernels_for(vectors);
#if defined(__x86_64__) && defined(__GNUC__)
  if (runnable(vectors) == Vectors::kAvx512 && bf16_rounding::vectorized()) {
    kernels.affine = unit_affine_bf16;
    kernels.dx = unit_dx_bf16;
  }
#endif
  return kernels;
}

UnitKernels unit_kernels_for(Vectors vectors) {
  switch (runnable(vectors)) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx512:
      return {unit_sums_avx512, unit_affine_avx512, unit_backward_sums_avx512, unit_dx_avx512};
    case Vectors::kAvx2:
      return {unit_sums_avx2, unit_affine_avx2, unit_backward_sums_avx2, unit_dx_avx2};
#endif
    default:
      return {unit_sums_plain, unit_affine_plain, unit_backward_sums_plain, unit_dx_plain};
  }
}

/// A blocked tensor's units, and each channel's total over its units in example order.
struct Units {
  const NormShape& s;
  int blocks() const { return s.c / kBlock; }
  int count() const { return s.n * blocks(); }
  /// totals[ch] = the sum over examples of partial[(i * blocks + ch / 16) * 16 + ch % 16].
  void totals(const std::vector<double>& partial, double* totals) const {
    for (int ch = 0; ch < s.c; ++ch) {
      double t = 0;
      for (int i = 0; i < s.n; ++i)
        t += partial[(static_cast<size_t>(i) * blocks() + ch / kBlock) * kBlock + ch % kBlock];
      totals[ch] = t;
    }
  }
};

// The output pass over every unit: y = x * scale + shift (then the addend, then the ReLU), and
// its rounded copy where s asks for one.
void blocked_affine(const NormShape& s, const UnitKernels& kernels, const float* x,
                    const std::vector<float>& scale, const std::vector<float>& shift,
                    NormAddend addend, float* y) {
  const Units units{s};
  const int count = units.count(), hw = s.hw;
#pragma omp parallel for schedule(static)
  for (int u = 0; u < count; ++u) {
    const int b = (u % units.blocks()) * kBlock;
    kernels.affine(x + unit_at(u, hw), addend.values ? addend.values + unit_at(u, hw) : nullptr, hw,
                   scale.data() + b, shift.data() + b, addend.values ? addend.relu : s.relu,
                   y ? y + unit_at(u, hw) : nullptr,
                   s.rounded ? s.rounded + unit_at(u, hw) : nullptr);
  }
}

void blocked_forward_training(const NormShape& s, float epsilon, const float* x, const float* gamma,
                              const float* beta, float* y, float* mean, float* var, Vectors vectors,
                              float* scale_out, float* shift_out, NormAddend addend) {
  const UnitKernels kernels = unit_kernels_for(vectors);
  const Units units{s};
  const int count = units.count(), hw = s.hw;
  const double m = static_cast<double>(s.n) * s.hw;
  // Each unit's sums, then its squared deviations from its own mean while it is still in the
  // cache; the channel's variance then adds the units' deviations and their means' deviations
  // from the channel's mean (Chan's combination), in example order.
  const size_t slots = static_cast<size_t>(count) * kBlock;
  // The deviations are taken from the unit's mean rounded to float (the center the float loops
  // subtract), and Chan's combination uses that same center.
  std::vector<double> sums(slots), squares(slots), mu(s.c), total(s.c), unit_mean(slots);
#pragma omp parallel for schedule(static)
  for (int u = 0; u < count; ++u) {
    const size_t at = static_cast<size_t>(u) * kBlock;
    kernels.sums(x + unit_at(u, hw), hw, nullptr, sums.data() + at);
    float center[kBlock];
    for (int k = 0; k < kBlock; ++k) {
      center[k] = static_cast<float>(sums[at + k] / hw);
      unit_mean[at + k] = center[k];
    }
    kernels.sums(x + unit_at(u, hw), hw, center, squares.data() + at);
  }
  units.totals(sums, total.data());
  for (int ch = 0; ch < s.c; ++ch) mu[ch] = total[ch] / m;
  for (size_t at = 0; at < slots; ++at) {
    const double d = unit_mean[at] - mu[(at / kBlock % units.blocks()) * kBlock + at % kBlock];
    squares[at] += hw * (d * d);
  }
  units.totals(squares, total.data());
  std::vector<float> scale(s.c), shift(s.c);
  for (int ch = 0; ch < s.c; ++ch) {
    mean[ch] = static_cast<float>(mu[ch]);
    var[ch] = static_cast<float>(total[ch] / m);
    folded(epsilon, gamma, beta, mean[ch], var[ch], ch, &scale[ch], &shift[ch]);
    if (scale_out) scale_out[ch] = scale[ch];
    if (shift_out) shift_out[ch] = shift[ch];
  }
  // With rounded_only, the pass writes the copy alone (a null y).
  blocked_affine(s, s.rounded ? rounding_kernels_for(vectors) : kernels, x, scale, shift, addend,
                 s.rounded && s.rounded_only ? nullptr : y);
}

void blocked_forward_inference(const NormShape& s, float epsilon, const float* x,
                               const float* gamma, const float* beta, const float* mean,
                               const float* var, float* y, Vectors vectors, NormAddend addend) {
  std::vector<float> scale(s.c), shift(s.c);
  for (int ch = 0; ch < s.c; ++ch)
    folded(epsilon, gamma, beta, mean[ch], var[ch], ch, &scale[ch], &shift[ch]);
  blocked_affine(s, s.rounded ? rounding_kernels_for(vectors) : unit_kernels_for(vectors), x, scale,
                 shift, addend, y);
}

void blocked_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                      const float* dy, const float* gamma, const float* mean, const float* var,
                      float* dx, float* dgamma, float* dbeta, Vectors vectors,
                      const float* relu_scale, const float* relu_shift) {
  const int from = !s.relu ? kNoMask : relu_scale ? kFromX : kFromY;
  DT_ENFORCE(y || from != kFromY,
             "batch normalization's backward needs its forward's output for the ReLU's mask, "
             "which that forward did not write (NormShape::rounded_only)");
  const UnitKernels kernels = s.rounded ? rounding_kernels_for(vectors) : unit_kernels_for(vectors);
  const Units units{s};
  const int count = units.count(), hw = s.hw;
  const double m = static_cast<double>(s.n) * s.hw;
  std::vector<float> mu(s.c), inv(s.c), g(s.c), mean_dy(s.c), mean_dy_xhat(s.c);
  for (int ch = 0; ch < s.c; ++ch) {
    const double inv_ch = 1.0 / std::sqrt(static_cast<double>(var[ch]) + epsilon);
    mu[ch] = mean[ch];
    inv[ch] = static_cast<float>(inv_ch);
    g[ch] = static_cast<float>((gamma ? gamma[ch] : 1.0) * inv_ch);
  }
  std::vector<double> total_dy(s.c), total_dy_xhat(s.c);
  std::vector<double> partial_dy(static_cast<size_t>(count) * kBlock),
      partial_dy_xhat(partial_dy.size());
#pragma omp parallel for schedule(static)
  for (int u = 0; u < count; ++u) {
    const int b = (u % units.blocks()) * kBlock;
    const size_t at = unit_at(u, hw);
    const UnitMask mask{relu_scale ? relu_scale + b : nullptr,
                        relu_shift ? relu_shift + b : nullptr};
    kernels.backward_sums(x + at, y ? y + at : nullptr, dy + at, hw, from, mask, mu.data() + b,
                          inv.data() + b, partial_dy.data() + static_cast<size_t>(u) * kBlock,
                          partial_dy_xhat.data() + static_cast<size_t>(u) * kBlock);
  }
  units.totals(partial_dy, total_dy.data());
  units.totals(partial_dy_xhat, total_dy_xhat.data());
  for (int ch = 0; ch < s.c; ++ch) {
    if (dbeta) dbeta[ch] = static_cast<float>(total_dy[ch]);
    if (dgamma) dgamma[ch] = static_cast<float>(total_dy_xhat[ch]);
    mean_dy[ch] = static_cast<float>(total_dy[ch] / m);
    mean_dy_xhat[ch] = static_cast<float>(total_dy_xhat[ch] / m);
  }
  if (!dx) return;
#pragma omp parallel for schedule(static)
  for (int u = 0; u < count; ++u) {
    const int b = (u % units.blocks()) * kBlock;
    const size_t at = unit_at(u, hw);
    const UnitGradient ug{mu.data() + b, inv.data() + b, g.data() + b, mean_dy.data() + b,
                          mean_dy_xhat.data() + b};
    const UnitMask mask{relu_scale ? relu_scale + b : nullptr,
                        relu_shift ? relu_shift + b : nullptr};
    // With rounded_only, the pass writes the copy alone (a null dx).
    kernels.dx(x + at, y ? y + at : nullptr, dy + at, hw, from, mask, ug,
               s.rounded && s.rounded_only ? nullptr : dx + at,
               s.rounded ? s.rounded + at : nullptr);
  }
}

}  // namespace

void host_batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                     const float* gamma, const float* beta, float* y, float* mean,
                                     float* var, Vectors vectors, float* scale, float* shift,
                                     NormAddend addend) {
  DT_ENFORCE(!addend.values || (s.layout == Layout::kBlocked && !s.relu),
             "batch normalization takes an add into its output pass in blocks of channels only");
  DT_ENFORCE(!addend.values || !s.rounded_only,
             "batch normalization writes a sum it took in whole, not only its rounded copy");
  if (s.layout == Layout::kBlocked)
    return blocked_forward_training(s, epsilon, x, gamma, beta, y, mean, var, vectors, scale, shift,
                                    addend);
  const Kernels kernels = kernels_for(vectors);
  const Forward f{s, epsilon, x, gamma, beta, y, mean, var};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) kernels.forward(f, ch);
  if (s.rounded) bf16_rounding::round_any(y, s.count(), s.rounded);
}

void host_batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                      const float* gamma, const float* beta, const float* mean,
                                      const float* var, float* y, Vectors vectors,
                                      NormAddend addend) {
  DT_ENFORCE(!addend.values || (s.layout == Layout::kBlocked && !s.relu),
             "batch normalization takes an add into its output pass in blocks of channels only");
  if (s.layout == Layout::kBlocked)
    return blocked_forward_inference(s, epsilon, x, gamma, beta, mean, var, y, vectors, addend);
  const Kernels kernels = kernels_for(vectors);
  const Inference f{s, epsilon, x, gamma, beta, mean, var, y};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) kernels.inference(f, ch);
  if (s.rounded) bf16_rounding::round_any(y, s.count(), s.rounded);
}

void host_batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                             const float* dy, const float* gamma, const float* mean,
                             const float* var, float* dx, float* dgamma, float* dbeta,
                             Vectors vectors, const float* relu_scale, const float* relu_shift) {
  DT_ENFORCE(dx || !s.rounded, "a rounded copy of a dx batch normalization does not write");
  if (s.layout == Layout::kBlocked)
    return blocked_backward(s, epsilon, x, y, dy, gamma, mean, var, dx, dgamma, dbeta, vectors,
                            relu_scale, relu_shift);
  const Kernels kernels = kernels_for(vectors);
  const Backward b{s, epsilon, x, y, dy, gamma, mean, var, dx, dgamma, dbeta};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) {
    thread_local std::vector<float> masked;
    if (s.relu) masked.resize(static_cast<size_t>(s.n) * s.hw);
    kernels.backward(b, ch, masked.data());
  }
  if (s.rounded) bf16_rounding::round_any(dx, s.count(), s.rounded);
}

void host_batchnorm_sums(const NormShape& s, const float* x, const float* center, float* sums,
                         Vectors vectors) {
  DT_ENFORCE(s.layout == Layout::kPlain, "batchnorm_sums takes plain NCHW");
  const Kernels kernels = kernels_for(vectors);
  const Sums f{s, x, center, sums};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) kernels.sums(f, ch);
}

void host_batchnorm_backward_data(const NormShape& s, float epsilon, const float* x, const float* y,
                                  const float* dy, const float* gamma, const float* mean,
                                  const float* var, const float* totals, double count, float* dx,
                                  Vectors vectors) {
  DT_ENFORCE(s.layout == Layout::kPlain, "batchnorm_backward_data takes plain NCHW");
  const Kernels kernels = kernels_for(vectors);
  const Backward b{s, epsilon, x, y, dy, gamma, mean, var, dx, nullptr, nullptr, totals, count};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) {
    thread_local std::vector<float> masked;
    if (s.relu) masked.resize(static_cast<size_t>(s.n) * s.hw);
    kernels.backward_data(b, ch, masked.data());
  }
}

}  // namespace dtrain::nn
