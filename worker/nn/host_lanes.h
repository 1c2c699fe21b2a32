// Sums in double whose order is the code's, not the thread count's or the vector width's: what
// the host normalization loops (host_norm.cc, host_sequence.cc) reduce with. Include only from
// files compiled with -ffp-contract=off, whose loops are compiled once per vector width.
#pragma once

/// The bodies that use these are compiled into each wrapper for its vector width; they must
/// inline there.
#define DT_INLINE inline __attribute__((always_inline))

namespace dtrain::nn {

// A sum in double over kLanes interleaved accumulators: value p of each block goes to lane
// p % kLanes, in order, and the lanes are added in order at the end. The order is the code's,
// whatever the thread count or the vector width, so the result is the same on every machine;
// the lanes let the compiler keep them in vector registers.
constexpr int kLanes = 8;
struct Lanes {
  double lane[kLanes] = {};

  DT_INLINE void add(const float* v, int count) {
    int p = 0;
    for (; p + kLanes <= count; p += kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) lane[k] += v[p + k];
    }
    for (int k = 0; p < count; ++p, ++k) lane[k] += v[p];
  }
  DT_INLINE void add_squared_deviations(const float* v, int count, double mu) {
    int p = 0;
    for (; p + kLanes <= count; p += kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) {
        double d = v[p + k] - mu;
        lane[k] += d * d;
      }
    }
    for (int k = 0; p < count; ++p, ++k) {
      double d = v[p] - mu;
      lane[k] += d * d;
    }
  }
  /// dy * xhat, xhat = (x - mu) * inv
  DT_INLINE void add_products(const float* dy, const float* x, int count, double mu, double inv) {
    int p = 0;
    for (; p + kLanes <= count; p += kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) lane[k] += dy[p + k] * ((x[p + k] - mu) * inv);
    }
    for (int k = 0; p < count; ++p, ++k) lane[k] += dy[p] * ((x[p] - mu) * inv);
  }
  DT_INLINE double total() const {
    double t = 0;
    for (double v : lane) t += v;
    return t;
  }
};

}  // namespace dtrain::nn
