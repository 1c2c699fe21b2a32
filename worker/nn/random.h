// Counter-based randomness: every draw is a pure function of its key (seed, epoch, step, layer,
// index), so a resumed run draws exactly what an uninterrupted one would, and results do not
// depend on the standard library's distributions.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DT_HOST_DEVICE __host__ __device__
#else
#define DT_HOST_DEVICE
#endif

namespace dtrain::nn {

/// splitmix64's finaliser: a well-mixed 64-bit hash.
DT_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// Hash of a key of up to five parts.
DT_HOST_DEVICE inline uint64_t random_key(uint64_t a, uint64_t b = 0, uint64_t c = 0,
                                          uint64_t d = 0, uint64_t e = 0) {
  return mix64(mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d) ^ e);
}

/// Uniform float in [0, 1) from the top 24 bits of a hash.
DT_HOST_DEVICE inline float unit_float(uint64_t hash) {
  return static_cast<float>(hash >> 40) * (1.0f / 16777216.0f);
}

}  // namespace dtrain::nn
