// A deterministic convolution weight and bias gradient for small filters (1x1, 2x2, 3x3, 5x5),
// where cuDNN's deterministic backward-filter algorithm is slow for few input channels (1 ms on
// an H100 for the tutorial CNN at batch 1024, and its bias gradient another 0.9 ms). Fixed chunks
// of images and fixed reduction trees make the result the same run after run. Larger filters
// stay with cuDNN. Include only from CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "worker/nn/backend.h"

namespace dtrain::nn::cuda {

/// True when conv_weight_grad() handles this shape's filter size.
bool has_small_filter_kernel(const ConvShape& s);
/// Floats of scratch conv_weight_grad() needs for s.
size_t conv_weight_grad_scratch_floats(const ConvShape& s);
/// Enqueues dw (k, c, kh, kw) and db (k) of s on stream from x (n, c, h, w; the padding of s is
/// applied here, not copied) and dy (n, k, oh, ow), masked by relu_y > 0 unless relu_y is null
/// (ReLU's gradient with y the forward output). scratch: conv_weight_grad_scratch_floats(s).
void conv_weight_grad(const ConvShape& s, const float* x, const float* dy, const float* relu_y,
                      float* dw, float* db, float* scratch, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
