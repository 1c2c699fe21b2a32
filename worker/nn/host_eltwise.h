// Keras's exact GELU (approximate=False: x * (1 + erf(x / sqrt 2)) / 2) and the softmax
// cross-entropy's rows on the host for the oneDNN backend (backend.h's eltwise_* and
// softmax_cross_entropy contracts), compiled for AVX-512, AVX2 and plain x86-64 and picked at
// run time as host_norm.h's loops are: the same bits at every width, and element by element (a
// row by row), so at every thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/nn/direct_conv.h"

namespace dtrain::nn {

/// y = gelu(x) over count floats (y may be x).
void host_gelu_forward(size_t count, const float* x, float* y,
                       direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);
/// dx = dy * gelu'(x) (dx may be x or dy).
void host_gelu_backward(size_t count, const float* x, const float* dy, float* dx,
                        direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);
/// Softmax cross-entropy over n rows of `classes` logits (Backend::softmax_cross_entropy's rows):
/// row_losses[i] = log softmax(row)[label] (float), row_hits[i] = whether the row's first
/// arg-max is its label, and unless dlogits is null, dlogits = (softmax - onehot(label)) * scale.
/// The labels must be in [0, classes). Each row on one thread: the same bits at any thread count.
void host_softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                                float scale, float* dlogits, float* row_losses, uint8_t* row_hits,
                                direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);

}  // namespace dtrain::nn
