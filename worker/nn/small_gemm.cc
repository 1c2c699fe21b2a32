// See small_gemm.h. A tile is R rows of C by V vectors of W floats, its R x V accumulators in
// registers; each step of the depth loads V vectors of B's row and broadcasts R elements of A,
// and adds their products with fused multiply-adds (this file is compiled with
// -ffp-contract=fast, and has no plain build: a CPU without FMA takes the caller's product). Rows
// go in tiles of 8, 4, 2 and 1 (AVX-512) or 4, 2 and 1 (AVX2), columns in tiles of two vectors
// and then one. A transposed B is copied into a thread's own scratch first.
#include "worker/nn/small_gemm.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "worker/nn/direct_conv.h"

namespace dtrain::nn {
namespace {

using direct_conv::Vectors;

// The bodies below are compiled into each width's entry point; they must inline there. (Not
// host_lanes.h's DT_INLINE: that header is for files compiled with -ffp-contract=off.)
#define DT_TILE_INLINE inline __attribute__((always_inline))

typedef float Float16 __attribute__((vector_size(64)));
typedef float Float8 __attribute__((vector_size(32)));

/// The operands of one product, A's element (i, d) at a[i * a_row + d * a_depth].
struct Operands {
  const float* a;
  size_t a_row, a_depth;
  const float* b;
  size_t ldb;
  float* c;
  size_t ldc;
  int m, n, k;
  Causal causal;
};

// C's rows [r, r + R) by columns [col, col + V * W), over the depth [d0, d1).
template <typename Vec, int R, int V>
DT_TILE_INLINE void tile(const Operands& o, int r, int col, int d0, int d1) {
  constexpr int W = sizeof(Vec) / sizeof(float);
  Vec acc[R][V];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = Vec{};
  const float* a = o.a + static_cast<size_t>(r) * o.a_row;
  for (int d = d0; d < d1; ++d) {
    const float* b = o.b + static_cast<size_t>(d) * o.ldb + col;
    Vec bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) __builtin_memcpy(&bv[v], b + v * W, sizeof(Vec));
    const float* ad = a + static_cast<size_t>(d) * o.a_depth;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float x = ad[static_cast<size_t>(i) * o.a_row];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] += x * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      __builtin_memcpy(o.c + static_cast<size_t>(r + i) * o.ldc + col + v * W, &acc[i][v],
                       sizeof(Vec));
}

// Every column tile of rows [r, r + R), within what the causal hint asks for.
template <typename Vec, int R>
DT_TILE_INLINE void row_tiles(const Operands& o, int r) {
  constexpr int W = sizeof(Vec) / sizeof(float);
  int d0 = 0, d1 = o.k, columns = o.n;
  switch (o.causal) {
    case Causal::kColumnsToRow:
      columns = std::min(o.n, (r + R + W - 1) / W * W);
      break;
    case Causal::kDepthToRow:
      d1 = std::min(o.k, r + R);
      break;
    case Causal::kDepthFromRow:
      d0 = std::min(o.k, r);
      break;
    case Causal::kNone:
      break;
  }
  int col = 0;
  for (; col + 2 * W <= columns; col += 2 * W) tile<Vec, R, 2>(o, r, col, d0, d1);
  if (col < columns) tile<Vec, R, 1>(o, r, col, d0, d1);
}

template <typename Vec, int Rows>
DT_TILE_INLINE void product(const Operands& o) {
  int r = 0;
  for (; r + Rows <= o.m; r += Rows) row_tiles<Vec, Rows>(o, r);
  if constexpr (Rows >= 8) {
    if (r + 4 <= o.m) row_tiles<Vec, 4>(o, r), r += 4;
  }
  if (r + 2 <= o.m) row_tiles<Vec, 2>(o, r), r += 2;
  if (r < o.m) row_tiles<Vec, 1>(o, r);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void product_avx512(const Operands& o) {
  product<Float16, 8>(o);
}
__attribute__((target("avx2,fma"))) void product_avx2(const Operands& o) {
  product<Float8, 4>(o);
}
#endif

#undef DT_TILE_INLINE

}  // namespace

bool small_gemm(bool a_transposed, bool b_transposed, int m, int n, int k, const float* a, int lda,
                const float* b, int ldb, float* c, int ldc, Causal causal) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const Vectors vectors = direct_conv::widest();
  const int width = vectors == Vectors::kAvx512 ? 16 : vectors == Vectors::kAvx2 ? 8 : 0;
  if (width == 0 || m <= 0 || n <= 0 || n % width != 0) return false;
  Operands o{a,
             a_transposed ? size_t{1} : static_cast<size_t>(lda),
             a_transposed ? static_cast<size_t>(lda) : size_t{1},
             b,
             static_cast<size_t>(ldb),
             c,
             static_cast<size_t>(ldc),
             m,
             n,
             k,
             causal};
  if (b_transposed) {  // B^T is n x k: its k x n copy, rows contiguous
    thread_local std::vector<float> copy;
    if (copy.size() < static_cast<size_t>(k) * n) copy.resize(static_cast<size_t>(k) * n);
    float* to = copy.data();
    for (int j0 = 0; j0 < n; j0 += 8)  // blocks of 8 rows of B^T: 8 lines read, 8 floats written
      for (int d = 0; d < k; ++d)
#pragma GCC unroll 8
        for (int j = j0; j < j0 + 8; ++j)
          to[static_cast<size_t>(d) * n + j] = b[static_cast<size_t>(j) * ldb + d];
    o.b = to;
    o.ldb = static_cast<size_t>(n);
  }
  if (vectors == Vectors::kAvx512) {
    product_avx512(o);
  } else {
    product_avx2(o);
  }
  return true;
#else
  (void)a_transposed, (void)b_transposed, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b,
      (void)ldb, (void)c, (void)ldc, (void)causal;
  return false;
#endif
}

}  // namespace dtrain::nn
