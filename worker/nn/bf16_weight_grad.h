// A convolution's weight gradient in mixed_bfloat16 from the bf16 tensors in blocks of 16
// channels that the oneDNN backend holds, with AVX512_BF16's dot products
// (docs/design.md#the-bf16-weight-gradient). oneDNN 2.6's kernel for it ran at about half the
// speed of its forward convolution on the ResNet's shapes; this one pairs examples as the
// instruction's pairs, so that neither tensor is transposed along its pixels. No oneDNN type
// appears here.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/spec/shapes.h"

namespace dtrain::nn::bf16_weight_grad {

/// Whether compute() takes s on this CPU: AVX512_BF16 (and AVX512BW), input and output channels
/// multiples of 16, both layouts blocked, and no bias (it writes no bias gradient).
bool suits(const ConvShape& s);

/// dw (k x c x kh x kw, OIHW, float32, overwritten) = sum over examples and output pixels of
/// dy[n][k][p][q] * x[n][c][p * sh + i - pad_top][q * sw + j - pad_left], over the x in the
/// image; x16 and dy16 are x and dy rounded to bf16 in blocks of 16 channels (nChw16c), as the
/// oneDNN backend's rounded copies and staged tensors are. Each weight is summed in float in a
/// fixed order (examples in pairs, then rows, then columns), whatever the thread count.
/// The memory a call works in, kept by the caller between calls (a step's every call reuses
/// it): each thread's band of x and dy with their examples interleaved in pairs, and the tasks'
/// partial sums.
struct Scratch {
  std::vector<uint16_t> bands;
  std::vector<float> partial;
};
void compute(const ConvShape& s, const uint16_t* x16, const uint16_t* dy16, float* dw,
             Scratch& scratch);

}  // namespace dtrain::nn::bf16_weight_grad
