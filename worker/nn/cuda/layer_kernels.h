// Small kernels the CUDA backend's layers need beside cuDNN and cuBLAS: explicit padding and its
// crop for Keras "same" convolutions, dense bias rows, a fill, and the cross-entropy loss rows with
// their deterministic sum. Each is enqueued on the given stream with nothing read back. Include
// only from CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::nn::cuda {

/// out (nc planes of ph x pw) = x (nc planes of h x w) placed at (top, left), zeros around it.
void launch_pad(const float* x, float* out, int nc, int h, int w, int top, int left, int ph, int pw,
                cudaStream_t stream);
/// The inverse of launch_pad: x = the h x w window of padded at (top, left).
void launch_crop(const float* padded, float* x, int nc, int h, int w, int top, int left, int ph,
                 int pw, cudaStream_t stream);
/// y (n x out) += b in every row.
void launch_bias_rows(float* y, const float* b, int n, int out, cudaStream_t stream);
/// y (n x out) = max(y + b, 0) in every row: the dense layer's bias and ReLU in one pass.
void launch_bias_rows_relu(float* y, const float* b, int n, int out, cudaStream_t stream);
/// y (n x k planes of `plane` values) = max(y + b[channel], 0): a convolution's bias and ReLU in
/// one pass (the same sums as cuDNN's add-tensor then activation, so the same bits).
void launch_bias_planes_relu(float* y, const float* b, int n, int k, int plane,
                             cudaStream_t stream);
void launch_fill(float* x, size_t n, float value, cudaStream_t stream);
/// From log-probabilities logp and logits (n x classes): dlogits = (softmax - onehot) / n
/// (unless null), row_loss and row_hit (n each, scratch), then ADDS the loss sum, hits and n to
/// totals[0..2] with a fixed reduction tree (the same result run after run).
void launch_cross_entropy(const float* logp, const float* logits, const int32_t* labels,
                          float* dlogits, float* row_loss, float* row_hit, int n, int classes,
                          float* totals, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
