// Small float products for the attention of a sequence model (docs/design.md#attention): each
// (example, head) pair multiplies blocks of a few dozen rows and columns, where a call to
// oneDNN's sgemm costs as much as its arithmetic. These are register tiles of AVX-512 or AVX2
// vectors with fused multiply-adds, one thread per call, each element of C summed over the depth
// in order: the bits depend on the CPU's vector width (as sgemm's do), never on the thread count.
// A causal attention's operands are half zeros; the tiles skip what they need not compute.
#pragma once

namespace dtrain::nn {

/// What a causal attention lets a product skip, for the rows [r, r + R) of a tile of C:
/// kColumnsToRow: C's columns after the tile's last row are not wanted (a score j > i is masked;
/// the caller never reads it). kDepthToRow: A's columns after the tile's last row are zeros (P
/// or dS, lower triangular). kDepthFromRow: A's columns before the tile's first row are zeros
/// (A is P^T or dS^T, upper triangular).
enum class Causal { kNone, kColumnsToRow, kDepthToRow, kDepthFromRow };

/// C (m x n, row-major, ldc) = op(A) op(B), A row-major m x k (lda) or, transposed, k x m; B
/// row-major k x n (ldb) or, transposed, n x k. Returns false, having written nothing, where
/// this CPU has neither AVX-512 nor AVX2 with FMA (as direct_conv::widest() says) or n is not a
/// multiple of its vector width; the caller then takes another product.
bool small_gemm(bool a_transposed, bool b_transposed, int m, int n, int k, const float* a, int lda,
                const float* b, int ldb, float* c, int ldc, Causal causal = Causal::kNone);

}  // namespace dtrain::nn
