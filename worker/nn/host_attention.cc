// See host_attention.h. For one (example, head), without a product: the scores of query i are
// built key by key over the head's features, vectorized across the keys (each score sums its
// features in order, at any width); the softmax runs in float on each row (host_lanes.h's
// exponential); every product that follows is an outer loop over rows in order with an inner
// loop across features or keys. With a product (the oneDNN backend's: small_gemm.h's tiles) the
// six products are its, the softmax and masks this file's. This file is compiled with
// -ffp-contract=off, so no width fuses a multiply and an add that another does not (the fusions
// there are host_lanes.h's fused(), at every width).
#include "worker/nn/host_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "worker/nn/host_lanes.h"

namespace dtrain::nn {
namespace {

using direct_conv::Vectors;

/// Strides of one (example, head)'s rows in the (n, t, heads, dim) tensors.
struct Head {
  const AttentionShape& s;
  size_t b, h;
  size_t q_row() const { return s.qk_stride(); }
  size_t v_row() const { return s.v_stride(); }
  size_t y_row() const { return s.y_stride(); }
  /// Offset of position i's features in q or k (and dq, dk), in v (and dv), in y (and dy).
  size_t qk(int i) const { return (b * s.t + i) * q_row() + h * s.key_dim; }
  size_t vv(int i) const { return (b * s.t + i) * v_row() + h * s.value_dim; }
  size_t yy(int i) const { return (b * s.t + i) * y_row() + h * s.value_dim; }
  /// probs' (t x t) block of this pair.
  size_t p() const { return (b * s.heads + h) * static_cast<size_t>(s.t) * s.t; }
  /// Keys query i sees: all, or 0..i when causal.
  int keys(int i) const { return s.causal ? i + 1 : s.t; }
};

// The sum of a[j] * b[j] as host_lanes.h's lane_sum sums.
DT_INLINE float lane_dot(const float* a, const float* b, int count) {
  float lane[kSumLanes] = {};
  int j = 0;
  for (; j + kSumLanes <= count; j += kSumLanes) {
#pragma omp simd
    for (int k = 0; k < kSumLanes; ++k) lane[k] += a[j + k] * b[j + k];
  }
  for (int k = 0; j < count; ++j, ++k) lane[k] += a[j] * b[j];
  float total = 0;
  for (float l : lane) total += l;
  return total;
}

// Row p's softmax over its first `keys` scores, scaled, in place; the rest of its t set to 0.
// The loops run over whole blocks of kSumLanes where the row has room (what lies past `keys`
// there is read but counts as -infinity: its probability is 0), so they have no scalar tails;
// the zeros add nothing to the lanes' sum, so the bits are those of a sum over `keys`.
DT_INLINE void softmax_row(float* p, int keys, int t, float scale) {
  const int span = std::min(t, (keys + kSumLanes - 1) / kSumLanes * kSumLanes);
  float lane[kSumLanes];
  std::fill(lane, lane + kSumLanes, -INFINITY);
  int j = 0;
  for (; j + kSumLanes <= span; j += kSumLanes) {
#pragma omp simd
    for (int k = 0; k < kSumLanes; ++k) {
      const float v = j + k < keys ? p[j + k] : -INFINITY;
      lane[k] = lane[k] < v ? v : lane[k];
    }
  }
  for (int k = 0; j < keys; ++j, ++k) lane[k] = lane[k] < p[j] ? p[j] : lane[k];
  float top = lane[0];
  for (int k = 1; k < kSumLanes; ++k) top = top < lane[k] ? lane[k] : top;
  top *= scale;  // scale > 0: the largest scaled score (a maximum: any order gives it)
#pragma omp simd
  for (int i = 0; i < span; ++i) p[i] = i < keys ? exp_nonpositive(p[i] * scale - top) : 0.0f;
  const float inverse = 1.0f / lane_sum(p, span);
#pragma omp simd
  for (int i = 0; i < span; ++i) p[i] *= inverse;
  std::fill(p + span, p + t, 0.0f);
}

// The head's rows of x (t rows of dim features at stride row) transposed into out (dim x t).
DT_INLINE void transpose(const float* x, size_t row, int t, int dim, float* out) {
  for (int j = 0; j < t; ++j)
    for (int c = 0; c < dim; ++c) out[static_cast<size_t>(c) * t + j] = x[j * row + c];
}

DT_INLINE void forward_body(const AttentionShape& s, size_t pair, const float* q, const float* k,
                            const float* v, float* probs, float* y, float* kt) {
  const Head hd{s, pair / static_cast<size_t>(s.heads), pair % static_cast<size_t>(s.heads)};
  const int t = s.t, kd = s.key_dim, vd = s.value_dim;
  transpose(k + hd.qk(0), hd.q_row(), t, kd, kt);
  for (int i = 0; i < t; ++i) {
    const float* qi = q + hd.qk(i);
    float* p = probs + hd.p() + static_cast<size_t>(i) * t;
    const int keys = hd.keys(i);
    std::fill(p, p + t, 0.0f);
    for (int c = 0; c < kd; ++c) {
      const float qc = qi[c];
      const float* row = kt + static_cast<size_t>(c) * t;
#pragma omp simd
      for (int j = 0; j < keys; ++j) p[j] += qc * row[j];
    }
    softmax_row(p, keys, t, s.scale);
    float* yi = y + hd.yy(i);
    std::fill(yi, yi + vd, 0.0f);
    const size_t row = hd.p() + static_cast<size_t>(i) * t;
    for (int j = 0; j < keys; ++j) {
      const float pj = s.dropout > 0 ? p[j] * attention_keep(s, row + j) : p[j];
      const float* vj = v + hd.vv(j);
#pragma omp simd
      for (int c = 0; c < vd; ++c) yi[c] += pj * vj[c];
    }
  }
}

DT_INLINE void backward_body(const AttentionShape& s, size_t pair, const float* q, const float* k,
                             const float* v, const float* probs, const float* dy, float* dq,
                             float* dk, float* dv, float* vt, float* ds, float* dropped) {
  const Head hd{s, pair / static_cast<size_t>(s.heads), pair % static_cast<size_t>(s.heads)};
  const int t = s.t, kd = s.key_dim, vd = s.value_dim;
  transpose(v + hd.vv(0), hd.v_row(), t, vd, vt);
  for (int j = 0; j < t; ++j) {
    std::fill(dk + hd.qk(j), dk + hd.qk(j) + kd, 0.0f);
    std::fill(dv + hd.vv(j), dv + hd.vv(j) + vd, 0.0f);
  }
  for (int i = 0; i < t; ++i) {
    const float* p = probs + hd.p() + static_cast<size_t>(i) * t;
    const float* dyi = dy + hd.yy(i);
    const int keys = hd.keys(i);
    // dP[j] = dy_i . v_j, then dS = P (dP - sum P dP), scaled as the scores were.
    std::fill(ds, ds + t, 0.0f);
    for (int c = 0; c < vd; ++c) {
      const float g = dyi[c];
      const float* row = vt + static_cast<size_t>(c) * t;
#pragma omp simd
      for (int j = 0; j < keys; ++j) ds[j] += g * row[j];
    }
    // With dropout, dy met the dropped probabilities: dP = dPd x mask, and dv takes Pd.
    const size_t row = hd.p() + static_cast<size_t>(i) * t;
    if (s.dropout > 0) {
      for (int j = 0; j < keys; ++j) {
        const float keep = attention_keep(s, row + j);
        dropped[j] = p[j] * keep;
        ds[j] *= keep;
      }
    }
    const float* pd = s.dropout > 0 ? dropped : p;
    const float dot = lane_dot(p, ds, keys);
#pragma omp simd
    for (int j = 0; j < keys; ++j) ds[j] = p[j] * (ds[j] - dot) * s.scale;
    // dv_j += Pd_ij dy_i; dq_i = sum_j dS_ij k_j; dk_j += dS_ij q_i.
    const float* qi = q + hd.qk(i);
    float* dqi = dq + hd.qk(i);
    std::fill(dqi, dqi + kd, 0.0f);
    for (int j = 0; j < keys; ++j) {
      const float pj = pd[j], dsj = ds[j];
      float* dvj = dv + hd.vv(j);
#pragma omp simd
      for (int c = 0; c < vd; ++c) dvj[c] += pj * dyi[c];
      const float* kj = k + hd.qk(j);
      float* dkj = dk + hd.qk(j);
#pragma omp simd
      for (int c = 0; c < kd; ++c) {
        dqi[c] += dsj * kj[c];
        dkj[c] += dsj * qi[c];
      }
    }
  }
}

// Asks for the t rows of `width` floats at `at`, `row` floats apart, to be brought into cache
// (for writing when `write`): the next pair's rows, while this pair computes. A pair's rows are
// a head's slice of each position's features, so the hardware's prefetcher does not see them
// coming; without this the attention of a model larger than the cache waits on memory for a
// third of its time (docs/design.md#attention).
DT_INLINE void prefetch_rows(const float* at, size_t row, int t, int width, bool write) {
  for (int i = 0; i < t; ++i)
    for (int c = 0; c < width; c += 16) {
      if (write) {
        __builtin_prefetch(at + static_cast<size_t>(i) * row + c, 1);
      } else {
        __builtin_prefetch(at + static_cast<size_t>(i) * row + c, 0);
      }
    }
}

// prefetch_rows for the pair after `pair` (none after the last): its rows of q-, k- and v-shaped
// tensors and of a y-shaped one, each skipped when null.
DT_INLINE void prefetch_next_pair(const AttentionShape& s, size_t pair, const float* qs,
                                  const float* ks, const float* vs, const float* ys, bool write) {
  const size_t heads = static_cast<size_t>(s.heads);
  if (pair + 1 >= static_cast<size_t>(s.n) * heads) return;
  const Head next{s, (pair + 1) / heads, (pair + 1) % heads};
  if (qs) prefetch_rows(qs + next.qk(0), next.q_row(), s.t, s.key_dim, write);
  if (ks) prefetch_rows(ks + next.qk(0), next.q_row(), s.t, s.key_dim, write);
  if (vs) prefetch_rows(vs + next.vv(0), next.v_row(), s.t, s.value_dim, write);
  if (ys) prefetch_rows(ys + next.yy(0), next.y_row(), s.t, s.value_dim, write);
}

// One pair's forward with its two products by `product`: the scores into its probs block (every
// key; the causal mask is applied by the softmax, which leaves masked probabilities 0), each
// row's softmax, then y = P v (P dropped, in `dropped`, with dropout).
DT_INLINE void product_forward_body(const AttentionShape& s, size_t pair, const float* q,
                                    const float* k, const float* v, float* probs, float* y,
                                    float* dropped, AttentionProduct product) {
  const Head hd{s, pair / static_cast<size_t>(s.heads), pair % static_cast<size_t>(s.heads)};
  const int t = s.t, q_row = static_cast<int>(hd.q_row()), v_row = static_cast<int>(hd.v_row()),
            y_row = static_cast<int>(hd.y_row());
  float* p = probs + hd.p();
  prefetch_next_pair(s, pair, q, k, v, nullptr, false);
  prefetch_next_pair(s, pair, nullptr, nullptr, nullptr, y, true);
  const Causal masked = s.causal ? Causal::kColumnsToRow : Causal::kNone;
  product(false, true, t, t, s.key_dim, q + hd.qk(0), q_row, k + hd.qk(0), q_row, p, t, masked);
  for (int i = 0; i < t; ++i) softmax_row(p + static_cast<size_t>(i) * t, hd.keys(i), t, s.scale);
  const float* weights = p;
  if (s.dropout > 0) {
    for (size_t e = 0; e < static_cast<size_t>(t) * t; ++e)
      dropped[e] = p[e] * attention_keep(s, hd.p() + e);
    weights = dropped;
  }
  product(false, false, t, s.value_dim, t, weights, t, v + hd.vv(0), v_row, y + hd.yy(0), y_row,
          s.causal ? Causal::kDepthToRow : Causal::kNone);
}

// Its backward: dP = dy v^T, dv = P^T dy (both through the dropout's mask), dS = P (dP - sum P
// dP) scaled, dq = dS k, dk = dS^T q.
DT_INLINE void product_backward_body(const AttentionShape& s, size_t pair, const float* q,
                                     const float* k, const float* v, const float* probs,
                                     const float* dy, float* dq, float* dk, float* dv, float* ds,
                                     float* dropped, AttentionProduct product) {
  const Head hd{s, pair / static_cast<size_t>(s.heads), pair % static_cast<size_t>(s.heads)};
  const int t = s.t, q_row = static_cast<int>(hd.q_row()), v_row = static_cast<int>(hd.v_row()),
            y_row = static_cast<int>(hd.y_row());
  const float* p = probs + hd.p();
  prefetch_next_pair(s, pair, q, k, v, dy, false);
  prefetch_next_pair(s, pair, dq, dk, dv, nullptr, true);
  const Causal lower = s.causal ? Causal::kDepthToRow : Causal::kNone,
               upper = s.causal ? Causal::kDepthFromRow : Causal::kNone;
  product(false, true, t, t, s.value_dim, dy + hd.yy(0), y_row, v + hd.vv(0), v_row, ds, t,
          s.causal ? Causal::kColumnsToRow : Causal::kNone);
  const float* weights = p;
  if (s.dropout > 0) {
    for (size_t e = 0; e < static_cast<size_t>(t) * t; ++e) {
      const float keep = attention_keep(s, hd.p() + e);
      dropped[e] = p[e] * keep;
      ds[e] *= keep;
    }
    weights = dropped;
  }
  product(true, false, t, s.value_dim, t, weights, t, dy + hd.yy(0), y_row, dv + hd.vv(0), v_row,
          upper);
  for (int i = 0; i < t; ++i) {
    const float* pi = p + static_cast<size_t>(i) * t;
    float* row = ds + static_cast<size_t>(i) * t;
    const int keys = hd.keys(i);
    const float dot = lane_dot(pi, row, keys);
#pragma omp simd
    for (int j = 0; j < keys; ++j) row[j] = pi[j] * (row[j] - dot) * s.scale;
    std::fill(row + keys, row + t, 0.0f);
  }
  product(false, false, t, s.key_dim, t, ds, t, k + hd.qk(0), q_row, dq + hd.qk(0), q_row, lower);
  product(true, false, t, s.key_dim, t, ds, t, q + hd.qk(0), q_row, dk + hd.qk(0), q_row, upper);
}

struct Kernels {
  void (*forward)(const AttentionShape&, size_t, const float*, const float*, const float*, float*,
                  float*, float*);
  void (*backward)(const AttentionShape&, size_t, const float*, const float*, const float*,
                   const float*, const float*, float*, float*, float*, float*, float*, float*);
  void (*product_forward)(const AttentionShape&, size_t, const float*, const float*, const float*,
                          float*, float*, float*, AttentionProduct);
  void (*product_backward)(const AttentionShape&, size_t, const float*, const float*, const float*,
                           const float*, const float*, float*, float*, float*, float*, float*,
                           AttentionProduct);
};

// The four entry points compiled for one vector width (TARGET: a function attribute, or none).
#define DT_ATTENTION_KERNELS(SUFFIX, TARGET)                                                       \
  TARGET void forward_##SUFFIX(const AttentionShape& s, size_t pair, const float* q,               \
                               const float* k, const float* v, float* probs, float* y,             \
                               float* kt) {                                                        \
    forward_body(s, pair, q, k, v, probs, y, kt);                                                  \
  }                                                                                                \
  TARGET void backward_##SUFFIX(const AttentionShape& s, size_t pair, const float* q,              \
                                const float* k, const float* v, const float* probs,                \
                                const float* dy, float* dq, float* dk, float* dv, float* vt,       \
                                float* ds, float* dropped) {                                       \
    backward_body(s, pair, q, k, v, probs, dy, dq, dk, dv, vt, ds, dropped);                       \
  }                                                                                                \
  TARGET void product_forward_##SUFFIX(const AttentionShape& s, size_t pair, const float* q,       \
                                       const float* k, const float* v, float* probs, float* y,     \
                                       float* dropped, AttentionProduct product) {                 \
    product_forward_body(s, pair, q, k, v, probs, y, dropped, product);                            \
  }                                                                                                \
  TARGET void product_backward_##SUFFIX(const AttentionShape& s, size_t pair, const float* q,      \
                                        const float* k, const float* v, const float* probs,        \
                                        const float* dy, float* dq, float* dk, float* dv,          \
                                        float* ds, float* dropped, AttentionProduct product) {     \
    product_backward_body(s, pair, q, k, v, probs, dy, dq, dk, dv, ds, dropped, product);          \
  }                                                                                                \
  const Kernels kernels_##SUFFIX = {forward_##SUFFIX, backward_##SUFFIX, product_forward_##SUFFIX, \
                                    product_backward_##SUFFIX};

DT_ATTENTION_KERNELS(plain, )
#if defined(__x86_64__) && defined(__GNUC__)
DT_ATTENTION_KERNELS(avx2, __attribute__((target("avx2,fma"))))
DT_ATTENTION_KERNELS(avx512, __attribute__((target("avx512f"))))
#endif
#undef DT_ATTENTION_KERNELS

Kernels kernels_for(Vectors vectors) {
  if (vectors == Vectors::kWidest) vectors = direct_conv::widest();
  DT_ENFORCE(direct_conv::runs(vectors), "this CPU cannot run attention's {} loops",
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

size_t pairs_of(const AttentionShape& s) {
  DT_ENFORCE(s.n > 0 && s.t > 0 && s.heads > 0 && s.key_dim > 0 && s.value_dim > 0,
             "attention of n {} t {} heads {} key_dim {} value_dim {}", s.n, s.t, s.heads,
             s.key_dim, s.value_dim);
  return static_cast<size_t>(s.n) * s.heads;
}

}  // namespace

void host_attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                            float* probs, float* y, Vectors vectors, AttentionProduct product) {
  const Kernels kernels = kernels_for(vectors);
  const auto pairs = static_cast<int64_t>(pairs_of(s));
  if (product) {
#pragma omp parallel
    {
      std::vector<float> dropped(s.dropout > 0 ? static_cast<size_t>(s.t) * s.t : 0);
#pragma omp for schedule(static)
      for (int64_t pair = 0; pair < pairs; ++pair)
        kernels.product_forward(s, static_cast<size_t>(pair), q, k, v, probs, y, dropped.data(),
                                product);
    }
    return;
  }
#pragma omp parallel
  {
    std::vector<float> kt(static_cast<size_t>(s.key_dim) * s.t);
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < pairs; ++pair)
      kernels.forward(s, static_cast<size_t>(pair), q, k, v, probs, y, kt.data());
  }
}

void host_attention_backward(const AttentionShape& s, const float* q, const float* k,
                             const float* v, const float* probs, const float* dy, float* dq,
                             float* dk, float* dv, Vectors vectors, AttentionProduct product) {
  const Kernels kernels = kernels_for(vectors);
  const auto pairs = static_cast<int64_t>(pairs_of(s));
  if (product) {
#pragma omp parallel
    {
      const size_t block = static_cast<size_t>(s.t) * s.t;
      std::vector<float> ds(block), dropped(s.dropout > 0 ? block : 0);
#pragma omp for schedule(static)
      for (int64_t pair = 0; pair < pairs; ++pair)
        kernels.product_backward(s, static_cast<size_t>(pair), q, k, v, probs, dy, dq, dk, dv,
                                 ds.data(), dropped.data(), product);
    }
    return;
  }
#pragma omp parallel
  {
    std::vector<float> vt(static_cast<size_t>(s.value_dim) * s.t), ds(static_cast<size_t>(s.t)),
        dropped(static_cast<size_t>(s.t));
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < pairs; ++pair)
      kernels.backward(s, static_cast<size_t>(pair), q, k, v, probs, dy, dq, dk, dv, vt.data(),
                       ds.data(), dropped.data());
  }
}

}  // namespace dtrain::nn
