// Keras's exact GELU (approximate=False: x * (1 + erf(x / sqrt 2)) / 2) on the host for the oneDNN
// backend (backend.h's eltwise_* contract), compiled for AVX-512, AVX2 and plain x86-64 and
// picked at run time as host_norm.h's loops are: the same bits at every width, and element by
// element, so at every thread count.
#pragma once

#include <cstddef>

#include "worker/nn/direct_conv.h"

namespace dtrain::nn {

/// y = gelu(x) over count floats (y may be x).
void host_gelu_forward(size_t count, const float* x, float* y,
                       direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);
/// dx = dy * gelu'(x) (dx may be x or dy).
void host_gelu_backward(size_t count, const float* x, const float* dy, float* dx,
                        direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);
/// y = e^x * scale over count floats, every x <= 0 (log-probabilities: a softmax's gradient), by
/// host_lanes.h's exp_nonpositive (y may be x).
void host_exp_scaled(size_t count, const float* x, float scale, float* y,
                     direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);

}  // namespace dtrain::nn
