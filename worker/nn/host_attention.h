// Scaled dot-product attention on the host for the oneDNN backend (backend.h's attention_*
// contract, docs/design.md#attention): one (example, head) pair per task, split over OpenMP's
// threads, each reduced in a fixed order, so the bits depend neither on the thread count nor
// on the vector width the loops run at (compiled for AVX-512, AVX2 and plain, picked at run
// time as host_norm.h's are). The reference backend has its own plain loops (the oracle).
#pragma once

#include "worker/nn/backend.h"
#include "worker/nn/direct_conv.h"
#include "worker/nn/small_gemm.h"

namespace dtrain::nn {

/// C (m x n, row-major, leading dimension ldc) = op(A) op(B), A and B row-major with leading
/// dimensions lda and ldb, op a transpose where asked: a small product the backend supplies
/// (the oneDNN backend's: its sgemm, one thread inside the pairs' loop, so its bits depend on
/// the CPU as the dense layers' products do, never on the thread count).
/// `causal` says which of C's elements the caller will not read and which of A's are zeros
/// (small_gemm.h): a product may skip them, or compute them all.
using AttentionProduct = void (*)(bool a_transposed, bool b_transposed, int m, int n, int k,
                                  const float* a, int lda, const float* b, int ldb, float* c,
                                  int ldc, Causal causal);

/// product null: every product in this file's own loops; else the six products of a pair (the
/// scores, the weighted sum, and the backward's four) are product's, the softmax and the mask
/// this file's.
void host_attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                            float* probs, float* y,
                            direct_conv::Vectors vectors = direct_conv::Vectors::kWidest,
                            AttentionProduct product = nullptr);
void host_attention_backward(const AttentionShape& s, const float* q, const float* k,
                             const float* v, const float* probs, const float* dy, float* dq,
                             float* dk, float* dv,
                             direct_conv::Vectors vectors = direct_conv::Vectors::kWidest,
                             AttentionProduct product = nullptr);

}  // namespace dtrain::nn
