// See host_sequence.h. Layer normalization's loops are compiled for AVX-512, AVX2 and plain
// x86-64 and picked at run time, as host_norm.cc's are; this file is compiled with
// -ffp-contract=off, so every width computes the same operations in the same order and gives the
// same bits (docs/design.md#sequences). The embedding's loops only copy and add in token order.
#include "worker/nn/host_sequence.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "worker/nn/host_lanes.h"

namespace dtrain::nn {
namespace {

using direct_conv::Vectors;

/// One forward's arguments, for every row.
struct Forward {
  int features;
  float epsilon;
  const float* x;
  const float* gamma;
  const float* beta;
  float* y;
  float* mean;
  float* rstd;
};

// y = x * scale + shift with scale = rstd * gamma and shift = beta - mean * scale (gamma 1, beta
// 0 when absent). Whether each is there is decided outside the loop: a select inside it became
// a masked load, which an all-false mask on a null pointer makes take a microcode assist per
// vector on AMD's cores (a layer without beta ran 10x slower).
template <bool kGamma, bool kBeta>
DT_INLINE void affine(const float* x, int n, float mean, float rstd, const float* gamma,
                      const float* beta, float* y) {
#pragma omp simd
  for (int j = 0; j < n; ++j) {
    const float scale = kGamma ? rstd * gamma[j] : rstd;
    const float shift = (kBeta ? beta[j] : 0.0f) - mean * scale;
    y[j] = x[j] * scale + shift;
  }
}

// Row r: its mean and biased variance in double, then y = x * scale + shift per feature with
// scale = rstd * gamma and shift = beta - mean * scale, in float (Keras's folding).
DT_INLINE void forward_row_body(const Forward& f, int r) {
  const int n = f.features;
  const float* x = f.x + static_cast<size_t>(r) * n;
  float* y = f.y + static_cast<size_t>(r) * n;
  Lanes sum;
  sum.add(x, n);
  const double mu = sum.total() / n;
  Lanes squares;
  squares.add_squared_deviations(x, n, mu);
  const float mean = static_cast<float>(mu);
  const float var = static_cast<float>(squares.total() / n);
  const float rstd = 1.0f / std::sqrt(var + f.epsilon);
  f.mean[r] = mean;
  f.rstd[r] = rstd;
  if (f.gamma && f.beta) {
    affine<true, true>(x, n, mean, rstd, f.gamma, f.beta, y);
  } else if (f.gamma) {
    affine<true, false>(x, n, mean, rstd, f.gamma, f.beta, y);
  } else if (f.beta) {
    affine<false, true>(x, n, mean, rstd, f.gamma, f.beta, y);
  } else {
    affine<false, false>(x, n, mean, rstd, f.gamma, f.beta, y);
  }
}

/// One backward's arguments.
struct Backward {
  int rows, features;
  const float* x;
  const float* dy;
  const float* gamma;
  const float* mean;
  const float* rstd;
  float* dx;
  float* dgamma;
  float* dbeta;
};

// Row r's dx; g is the calling thread's buffer of `features` floats (dy * gamma).
DT_INLINE void backward_row_body(const Backward& b, int r, float* g) {
  const int n = b.features;
  const size_t at = static_cast<size_t>(r) * n;
  const float* x = b.x + at;
  const float* dy = b.dy + at;
  float* dx = b.dx + at;
  const double mu = b.mean[r], inv = b.rstd[r];
  const float* gamma = b.gamma;
  if (gamma) {  // decided outside the loop, as affine's
#pragma omp simd
    for (int j = 0; j < n; ++j) g[j] = dy[j] * gamma[j];
  } else {
    std::copy(dy, dy + n, g);
  }
  Lanes sum_g, sum_g_xhat;
  sum_g.add_with_products(sum_g_xhat, g, x, n, mu, inv);
  const double mean_g = sum_g.total() / n, mean_g_xhat = sum_g_xhat.total() / n;
#pragma omp simd
  for (int j = 0; j < n; ++j) {
    const double xhat = (x[j] - mu) * inv;
    dx[j] = static_cast<float>(inv * (g[j] - mean_g - xhat * mean_g_xhat));
  }
}

// Rows [first, last) in order: each row's dx (when wanted: g is the calling thread's buffer of
// `features` floats) and, while the row is in cache, its part of the column sums of dbeta and
// dgamma added into sums (2 x features doubles, dbeta's then dgamma's; null when neither is
// wanted): one pass over x and dy.
DT_INLINE void chunk_body(const Backward& b, int first, int last, float* g, double* sums) {
  const int n = b.features;
  for (int r = first; r < last; ++r) {
    if (b.dx) backward_row_body(b, r, g);
    if (!sums) continue;
    const size_t at = static_cast<size_t>(r) * n;
    const float* x = b.x + at;
    const float* dy = b.dy + at;
    const double mu = b.mean[r], inv = b.rstd[r];
    double* sum_dy = sums;
    double* sum_dy_xhat = sums + n;
#pragma omp simd
    for (int k = 0; k < n; ++k) {
      sum_dy[k] += dy[k];
      sum_dy_xhat[k] += dy[k] * ((x[k] - mu) * inv);
    }
  }
}

/// The loops compiled for one vector width.
struct Kernels {
  void (*forward)(const Forward&, int);
  void (*chunk)(const Backward&, int, int, float*, double*);
};

void forward_plain(const Forward& f, int r) {
  forward_row_body(f, r);
}
void chunk_plain(const Backward& b, int first, int last, float* g, double* sums) {
  chunk_body(b, first, last, g, sums);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void forward_avx2(const Forward& f, int r) {
  forward_row_body(f, r);
}
__attribute__((target("avx2"))) void chunk_avx2(const Backward& b, int first, int last, float* g,
                                                double* sums) {
  chunk_body(b, first, last, g, sums);
}
__attribute__((target("avx512f"))) void forward_avx512(const Forward& f, int r) {
  forward_row_body(f, r);
}
__attribute__((target("avx512f"))) void chunk_avx512(const Backward& b, int first, int last,
                                                     float* g, double* sums) {
  chunk_body(b, first, last, g, sums);
}
#endif

Kernels kernels_for(Vectors vectors) {
  if (vectors == Vectors::kWidest) vectors = direct_conv::widest();
  DT_ENFORCE(direct_conv::runs(vectors), "this CPU cannot run layer normalization's {} loops",
             direct_conv::vectors_name(vectors));
  switch (vectors) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx512:
      return {forward_avx512, chunk_avx512};
    case Vectors::kAvx2:
      return {forward_avx2, chunk_avx2};
#endif
    default:
      return {forward_plain, chunk_plain};
  }
}

}  // namespace

void host_check_token_ids(int rows, int input_dim, const float* ids) {
  for (int r = 0; r < rows; ++r) {
    const float id = ids[r];
    // NaN fails the first test; an id past 2^24 is past every input_dim dtrain accepts.
    DT_ENFORCE(id >= 0.0f && id < static_cast<float>(input_dim) && id == std::floor(id),
               "embedding: token {} has id {}, which is not an integer in [0, {}) (input_dim)", r,
               id, input_dim);
  }
}

void host_embedding_forward(int rows, int input_dim, int output_dim, const float* ids,
                            const float* table, float* y) {
  host_check_token_ids(rows, input_dim, ids);
  const size_t width = static_cast<size_t>(output_dim);
#pragma omp parallel for schedule(static) if (static_cast <size_t>(rows) * width >= (1u << 14))
  for (int r = 0; r < rows; ++r) {
    const float* row = table + static_cast<size_t>(ids[r]) * width;
    std::copy(row, row + width, y + static_cast<size_t>(r) * width);
  }
}

// Each thread owns a range of the table's rows: it zeroes them, then walks every token in order
// and adds those whose id falls in its range. A row's sum is therefore its tokens' dy rows added
// in token order, whatever the threads.
void host_embedding_backward(int rows, int input_dim, int output_dim, const float* ids,
                             const float* dy, float* dtable) {
  host_check_token_ids(rows, input_dim, ids);
  const size_t width = static_cast<size_t>(output_dim);
#pragma omp parallel if (static_cast <size_t>(input_dim) * width >= (1u << 14))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = input_dim * t / threads, end = input_dim * (t + 1) / threads;
    std::fill(dtable + begin * width, dtable + end * width, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const int64_t id = static_cast<int64_t>(ids[r]);
      if (id < begin || id >= end) continue;
      float* out = dtable + id * width;
      const float* in = dy + static_cast<size_t>(r) * width;
#pragma omp simd
      for (size_t j = 0; j < width; ++j) out[j] += in[j];
    }
  }
}

void host_layernorm_forward(int rows, int features, float epsilon, const float* x,
                            const float* gamma, const float* beta, float* y, float* mean,
                            float* rstd, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const Forward f{features, epsilon, x, gamma, beta, y, mean, rstd};
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) kernels.forward(f, r);
}

// Rows in chunks of kChunkRows, the chunks shared out over the threads; each chunk's column sums
// in doubles of its own, added in chunk order at the end: the same bits at any thread count.
constexpr int kChunkRows = 128;
void host_layernorm_backward(int rows, int features, const float* x, const float* dy,
                             const float* gamma, const float* mean, const float* rstd, float* dx,
                             float* dgamma, float* dbeta, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const Backward b{rows, features, x, dy, gamma, mean, rstd, dx, dgamma, dbeta};
  const bool columns = dgamma || dbeta;
  if (!dx && !columns) return;
  const int chunks = (rows + kChunkRows - 1) / kChunkRows;
  const size_t per_chunk = 2 * static_cast<size_t>(features);
  std::vector<double> sums(columns ? static_cast<size_t>(chunks) * per_chunk : 0);
#pragma omp parallel for schedule(static)
  for (int c = 0; c < chunks; ++c) {
    thread_local std::vector<float> g;
    g.resize(static_cast<size_t>(features));
    kernels.chunk(b, c * kChunkRows, std::min(rows, (c + 1) * kChunkRows), g.data(),
                  columns ? sums.data() + static_cast<size_t>(c) * per_chunk : nullptr);
  }
  if (!columns) return;
  for (int k = 0; k < features; ++k) {
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int c = 0; c < chunks; ++c) {
      sum_dy += sums[static_cast<size_t>(c) * per_chunk + k];
      sum_dy_xhat += sums[static_cast<size_t>(c) * per_chunk + features + k];
    }
    if (dbeta) dbeta[k] = static_cast<float>(sum_dy);
    if (dgamma) dgamma[k] = static_cast<float>(sum_dy_xhat);
  }
}

}  // namespace dtrain::nn
