// What the files with hand-written AVX512_BF16 loops share (dnnl_parts.cc, host_norm.cc,
// bf16_weight_grad.cc): the target attribute of those functions, and the silencing of a GCC 12
// false positive around AVX-512 intrinsics. x86-64 GCC and clang only.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/// The ISA of a function with AVX512_BF16 intrinsics. No AVX-512 value crosses an OpenMP
/// region's boundary: clang outlines a region into a function of its own that does not inherit
/// the enclosing function's target attribute, and a 512-bit argument or result there is an ABI
/// error; so each region calls a function with this attribute and passes it only pointers,
/// counts and references.
#define DT_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/// Around such functions: GCC 12's AVX-512 intrinsics start some results from
/// _mm512_undefined_*, which -Wmaybe-uninitialized reports once they inline (a known false
/// positive; clang has no such warning).
#if defined(__clang__)
#define DT_AVX512_INTRINSICS_BEGIN
#define DT_AVX512_INTRINSICS_END
#else
#define DT_AVX512_INTRINSICS_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DT_AVX512_INTRINSICS_END _Pragma("GCC diagnostic pop")
#endif
#endif
