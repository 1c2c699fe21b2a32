// Conversions between the fp32 buffers every layer keeps and the 16-bit (bf16 or fp16) copies
// the CUDA backend's mixed-precision convolutions read and write (docs/design.md#mixed-precision).
// Round to nearest even; each is enqueued on the given stream with nothing read back. Include
// only from CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace dtrain::nn::cuda {

/// The 16-bit format a conversion writes or reads.
enum class Half { kBfloat16, kFloat16 };

/// out (n values of `half`) = x rounded.
void launch_to_half(const float* x, void* out, size_t n, Half half, cudaStream_t stream);
/// out (n fp32 values) = x widened.
void launch_from_half(const void* x, float* out, size_t n, Half half, cudaStream_t stream);
/// A 16-bit convolution's epilogue: y (n x k planes of `plane`) = y16 widened + b[channel], then
/// max(., 0) when relu.
void launch_conv_epilogue(const void* y16, const float* b, float* y, int n, int k, int plane,
                          bool relu, Half half, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
