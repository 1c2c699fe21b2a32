// Batch normalization on the host for the oneDNN backend (backend.h's batchnorm_* contract):
// channels split over OpenMP's threads, each channel reduced by one thread in a fixed order (double
// sums in eight interleaved lanes, which the compiler vectorizes), so the results do not depend on
// the thread count. The reference backend has its own plain loops (the oracle); these are not
// shared with it.
#pragma once

#include "worker/nn/backend.h"

namespace dtrain::nn {

void host_batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                     const float* gamma, const float* beta, float* y, float* mean,
                                     float* var);
void host_batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                      const float* gamma, const float* beta, const float* mean,
                                      const float* var, float* y);
void host_batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                             const float* dy, const float* gamma, const float* mean,
                             const float* var, float* dx, float* dgamma, float* dbeta);

}  // namespace dtrain::nn
