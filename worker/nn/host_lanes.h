// Sums in double whose order is the code's, not the thread count's or the vector width's: what
// the host normalization loops (host_norm.cc, host_sequence.cc) reduce with; and an exponential
// that gives the same bits at every width (host_attention.cc, host_eltwise.cc). Include only from
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
  /// add(dy, count) and, into products, products.add_products(dy, x, count, mu, inv), in one
  /// loop (the two chains of adds overlap); the same sums.
  DT_INLINE void add_with_products(Lanes& products, const float* dy, const float* x, int count,
                                   double mu, double inv) {
    int p = 0;
    for (; p + kLanes <= count; p += kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) {
        lane[k] += dy[p + k];
        products.lane[k] += dy[p + k] * ((x[p + k] - mu) * inv);
      }
    }
    for (int k = 0; p < count; ++p, ++k) {
      lane[k] += dy[p];
      products.lane[k] += dy[p] * ((x[p] - mu) * inv);
    }
  }
  DT_INLINE double total() const {
    double t = 0;
    for (double v : lane) t += v;
    return t;
  }
};

// The sum of v[0..count) in float over kSumLanes interleaved lanes, added in lane order at the
// end: the code's order at every vector width (a softmax's row sums, host_attention.cc and
// host_eltwise.cc).
constexpr int kSumLanes = 16;
DT_INLINE float lane_sum(const float* v, int count) {
  float lane[kSumLanes] = {};
  int j = 0;
  for (; j + kSumLanes <= count; j += kSumLanes) {
#pragma omp simd
    for (int k = 0; k < kSumLanes; ++k) lane[k] += v[j + k];
  }
  for (int k = 0; j < count; ++j, ++k) lane[k] += v[j];
  float total = 0;
  for (float l : lane) total += l;
  return total;
}

// a * b + c rounded once. Every width that calls it fuses (AVX-512 and AVX2 with FMA vectorize
// it; the plain build calls libm's fmaf, the same correctly rounded result), so the bits are
// those of every width.
DT_INLINE float fused(float a, float b, float c) {
  return __builtin_fmaf(a, b, c);
}

// e^x for x <= 0 (a softmax's shifted scores, erfc's e^(-z^2)), in plain float operations the
// compiler vectorizes: x = n ln 2 + r with n = round(x / ln 2) (adding and taking away 1.5 * 2^23
// rounds to nearest), ln 2 in two parts (Cody and Waite), Cephes's polynomial for e^r on
// [-ln 2 / 2, ln 2 / 2], and 2^n built in the exponent's bits. Within 1e-7 of e^x, relative; 0
// below -87 (e^-87 is 1.6e-38); NaN stays NaN. Every width computes the same operations, so the
// bits do not depend on the vector width (libm's expf, a call per value, does not vectorize).
DT_INLINE float exp_nonpositive(float x) {
  const float kept = x < -87.0f ? -87.0f : x;
  const float n = fused(kept, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
  float r = fused(n, -0.693359375f, kept);
  r = fused(n, 2.12194440e-4f, r);
  float e = 1.9875691500e-4f;
  e = fused(e, r, 1.3981999507e-3f);
  e = fused(e, r, 8.3334519073e-3f);
  e = fused(e, r, 4.1665795894e-2f);
  e = fused(e, r, 1.6666665459e-1f);
  e = fused(e, r, 5.0000001201e-1f);
  e = fused(e, r * r, r) + 1.0f;
  const int bits = (static_cast<int>(n) + 127) << 23;  // n in [-126, 0]: a normal 2^n
  float two_n;
  __builtin_memcpy(&two_n, &bits, sizeof two_n);
  e = e * two_n;
  return x < -87.0f ? 0.0f : e;
}

}  // namespace dtrain::nn
