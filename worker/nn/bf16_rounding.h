// Float32 to bf16 for the oneDNN backend's rounded copies (dnnl_parts.h, Rounder): oneDNN's
// reorder, and the same conversion as a loop of AVX512_BF16's instruction split over OpenMP's
// threads where the CPU has it (docs/design.md#rounding-to-bf16). oneDNN's reorder runs that
// instruction too on these CPUs, on one thread: round to nearest even, subnormal inputs to zero,
// NaN quieted. No oneDNN type appears here, so tests can compare the two.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::nn::bf16_rounding {

/// Whether round_vectorized runs on this CPU (it has AVX512_BF16).
bool vectorized();
/// out[i] = in[i] as bf16 bits, by AVX512_BF16's conversion on OpenMP's threads; false, and
/// nothing written, where the CPU lacks it.
bool round_vectorized(const float* in, size_t count, uint16_t* out);
/// out[i] = in[i] as bf16 bits, by oneDNN's reorder.
void round_onednn(const float* in, size_t count, uint16_t* out);

}  // namespace dtrain::nn::bf16_rounding
