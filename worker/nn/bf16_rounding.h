// Float32 to bf16 for the oneDNN backend's rounded copies (dnnl_parts.h, Rounder): oneDNN's
// reorder, and the same conversion as a loop of AVX512_BF16's instruction split over OpenMP's
// threads where the CPU has it (docs/design.md#rounding-to-bf16). oneDNN's reorder runs that
// instruction too on these CPUs, on one thread: round to nearest even, subnormal inputs to zero,
// NaN quieted. No oneDNN type appears here, so tests can compare the two. The same for the
// blocked layout of a dense kernel that oneDNN's bf16 matmuls read
// (docs/design.md#rounding-to-bf16).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::nn::bf16_rounding {

/// Whether round_vectorized runs on this CPU (it has AVX512_BF16).
bool vectorized();
/// out[i] = in[i] as bf16 bits, by AVX512_BF16's conversion on OpenMP's threads; false, and
/// nothing written, where the CPU lacks it.
bool round_vectorized(const float* in, size_t count, uint16_t* out);
/// out[i] = in[i] as bf16 bits: round_vectorized where the CPU has it, else oneDNN's reorder.
void round_any(const float* in, size_t count, uint16_t* out);
/// out[i] = in[i] as bf16 bits, by oneDNN's reorder.
void round_onednn(const float* in, size_t count, uint16_t* out);

/// A dense kernel w (rows x cols, row-major float32) rounded, in one pass on OpenMP's threads,
/// into `blocked`: the bf16 layout (oneDNN's BA16a64b2a, B = w with k = rows, n = cols) that the
/// forward's matmul primitive asks for as weights, so that it does not pack w again at each call;
/// and into `plain`: w rounded in its own layout (round_vectorized's result), which the backward
/// product dy w^T reads. Either may be null; each holds rows * cols elements. Needs AVX512_BF16
/// and rows and cols multiples of 64; false, and nothing written, otherwise.
bool pack_vectorized(const float* w, int64_t rows, int64_t cols, uint16_t* blocked,
                     uint16_t* plain);
/// w in the same blocked layout by oneDNN's reorder (the test's oracle).
void pack_onednn(const float* w, int64_t rows, int64_t cols, uint16_t* out);

}  // namespace dtrain::nn::bf16_rounding
