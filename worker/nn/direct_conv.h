// Convolutions with few input channels (a network's first layer: grey or RGB images) computed
// directly on the layers' NCHW buffers, for the oneDNN backend. Such a layer does little
// arithmetic per byte, so its cost is the passes over its large output: through oneDNN, whose
// kernels want it blocked (nChw16c) and whose ReLU mask is a pass of its own, five per step; here
// two, the forward writing it once and the weight gradient reading it (and y) once
// (docs/design.md#the-first-convolution). Plain C++ loops that the compiler vectorises along a
// row, split over OpenMP's threads; no backward-data (a first layer needs none; the oneDNN
// backend keeps its primitive for that).
#pragma once

#include "worker/nn/backend.h"

namespace dtrain::nn::direct_conv {

/// The vector width the loops run at: kWidest is the widest this CPU runs (AVX-512, AVX2 with
/// FMA, or plain x86-64); the others are for tests, which check each width the CPU runs.
enum class Vectors { kWidest, kAvx512, kAvx2, kPlain };
const char* vectors_name(Vectors vectors);
/// Whether this CPU runs the loops compiled for `vectors`.
bool runs(Vectors vectors);
/// The width kWidest stands for on this CPU.
Vectors widest();

/// Whether the direct loops take shape s: few enough input channels times kernel taps that the
/// layer is bound by its output's passes (c * kh * kw <= 32), at column stride 1.
bool suits(const ConvShape& s);

/// y = conv(x, w) + b, then max(y, 0) when relu; NCHW x and y, OIHW w. With bf16 the products'
/// inputs are x and w rounded to bf16 first (mixed_bfloat16); sums are float32.
void forward(const ConvShape& s, const float* x, const float* w, const float* b, float* y,
             bool relu, bool bf16, Vectors vectors = Vectors::kWidest);

/// dw, db of dz = dy where y > 0 (mask = y, ReLU's forward output), or of dz = dy (mask null),
/// the mask applied as dy is read. With bf16, x and dz are rounded to bf16 before their products
/// and sums (the bias gradient sums the rounded dz, as oneDNN's primitive does). Per image the
/// sums are float32, across images double; the result depends on the thread count only.
void backward_weights(const ConvShape& s, const float* x, const float* mask, const float* dy,
                      float* dw, float* db, bool bf16, Vectors vectors = Vectors::kWidest);

}  // namespace dtrain::nn::direct_conv
