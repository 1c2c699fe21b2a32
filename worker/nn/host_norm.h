// Batch normalization on the host for the oneDNN backend (backend.h's batchnorm_* contract):
// channels split over OpenMP's threads, each channel reduced by one thread in a fixed order (double
// sums in eight interleaved lanes, which the compiler vectorizes), so the results do not depend on
// the thread count, nor on the vector width the loops run at. In blocks of channels (NormShape's
// layout) the threads take one example's block of 16 channels at a time, the channels in vector
// lanes, each channel's blocks added in example order: again the same bits at any thread count
// and width (docs/design.md#blocked-activations). The reference backend has its own plain loops
// (the oracle); these are not shared with it.
#pragma once

#include "worker/nn/backend.h"
#include "worker/nn/direct_conv.h"

namespace dtrain::nn {

/// A residual block's add after batch normalization, taken into its output pass (blocked
/// layout only): y = bn(x) + values, then max(y, 0) with relu (backend.h's
/// batchnorm_add_forward_*). The float operations of the two apart: the same bits.
struct NormAddend {
  const float* values = nullptr;
  bool relu = false;
};

/// vectors: the width the loops run at (direct_conv.h's Vectors: the widest this CPU runs, or
/// one named by a test); every width gives the same bits.
/// In blocks of channels (s.layout), the training forward also writes, where scale and shift are
/// given (c floats each), the factors its output is max(x * scale + shift, 0) of with a fused
/// ReLU; given back to the backward of that forward as relu_scale and relu_shift, they give it the
/// ReLU's mask from x instead of from y (the same float operations: the same mask), one tensor
/// fewer to read. Where s.rounded is set, the forwards write y, and the backward dx, rounded
/// there too: in blocks of channels in the pass that writes each value, else the whole tensor
/// after the pass.
void host_batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                     const float* gamma, const float* beta, float* y, float* mean,
                                     float* var,
                                     direct_conv::Vectors vectors = direct_conv::Vectors::kWidest,
                                     float* scale = nullptr, float* shift = nullptr,
                                     NormAddend addend = {});
void host_batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                      const float* gamma, const float* beta, const float* mean,
                                      const float* var, float* y,
                                      direct_conv::Vectors vectors = direct_conv::Vectors::kWidest,
                                      NormAddend addend = {});
void host_batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                             const float* dy, const float* gamma, const float* mean,
                             const float* var, float* dx, float* dgamma, float* dbeta,
                             direct_conv::Vectors vectors = direct_conv::Vectors::kWidest,
                             const float* relu_scale = nullptr, const float* relu_shift = nullptr);
/// Synchronized batch normalization's pieces (backend.h's batchnorm_sums and
/// batchnorm_backward_data): the same per-channel order, and the same bits at every width.
void host_batchnorm_sums(const NormShape& s, const float* x, const float* center, float* sums,
                         direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);
void host_batchnorm_backward_data(const NormShape& s, float epsilon, const float* x, const float* y,
                                  const float* dy, const float* gamma, const float* mean,
                                  const float* var, const float* totals, double count, float* dx,
                                  direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);

}  // namespace dtrain::nn
