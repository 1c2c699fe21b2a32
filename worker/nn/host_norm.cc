// See host_norm.h.
#include "worker/nn/host_norm.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace dtrain::nn {
namespace {

// Channel ch's block of example i.
inline size_t at(const NormShape& s, int i, int ch) {
  return (static_cast<size_t>(i) * s.c + ch) * static_cast<size_t>(s.hw);
}

// y = x * scale + shift over channel ch, for every example (with s.relu, max of that and 0).
void affine(const NormShape& s, int ch, const float* x, float scale, float shift, float* y) {
  for (int i = 0; i < s.n; ++i) {
    const float* xi = x + at(s, i, ch);
    float* yi = y + at(s, i, ch);
    if (s.relu) {
#pragma omp simd
      for (int p = 0; p < s.hw; ++p) {
        float v = xi[p] * scale + shift;
        yi[p] = v > 0.0f ? v : 0.0f;
      }
    } else {
#pragma omp simd
      for (int p = 0; p < s.hw; ++p) yi[p] = xi[p] * scale + shift;
    }
  }
}

// A sum in double over kLanes interleaved accumulators: value p of each block goes to lane
// p % kLanes, in order, and the lanes are added in order at the end. The order is the code's,
// whatever the thread count or the vector width the compiler chose, so the result is the same on
// every machine; the lanes let the compiler keep them in vector registers.
constexpr int kLanes = 8;
struct Lanes {
  double lane[kLanes] = {};

  void add(const float* v, int count) {
    int p = 0;
    for (; p + kLanes <= count; p += kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) lane[k] += v[p + k];
    }
    for (int k = 0; p < count; ++p, ++k) lane[k] += v[p];
  }
  void add_squared_deviations(const float* v, int count, double mu) {
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
  void add_products(const float* dy, const float* x, int count, double mu, double inv) {
    int p = 0;
    for (; p + kLanes <= count; p += kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) lane[k] += dy[p + k] * ((x[p + k] - mu) * inv);
    }
    for (int k = 0; p < count; ++p, ++k) lane[k] += dy[p] * ((x[p] - mu) * inv);
  }
  double total() const {
    double t = 0;
    for (double v : lane) t += v;
    return t;
  }
};

// gamma / sqrt(var + epsilon) and beta - mean * that, as Keras's batch_normalization folds them.
void folded(float epsilon, const float* gamma, const float* beta, float mean, float var, int ch,
            float* scale, float* shift) {
  float inv = 1.0f / std::sqrt(var + epsilon);
  *scale = gamma ? gamma[ch] * inv : inv;
  *shift = (beta ? beta[ch] : 0.0f) - mean * *scale;
}

}  // namespace

void host_batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                     const float* gamma, const float* beta, float* y, float* mean,
                                     float* var) {
  const double m = static_cast<double>(s.n) * s.hw;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) {
    Lanes sum;
    for (int i = 0; i < s.n; ++i) sum.add(x + at(s, i, ch), s.hw);
    const double mu = sum.total() / m;
    Lanes squares;
    for (int i = 0; i < s.n; ++i) squares.add_squared_deviations(x + at(s, i, ch), s.hw, mu);
    mean[ch] = static_cast<float>(mu);
    var[ch] = static_cast<float>(squares.total() / m);
    float scale, shift;
    folded(epsilon, gamma, beta, mean[ch], var[ch], ch, &scale, &shift);
    affine(s, ch, x, scale, shift, y);
  }
}

void host_batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                      const float* gamma, const float* beta, const float* mean,
                                      const float* var, float* y) {
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) {
    float scale, shift;
    folded(epsilon, gamma, beta, mean[ch], var[ch], ch, &scale, &shift);
    affine(s, ch, x, scale, shift, y);
  }
}

void host_batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                             const float* dy, const float* gamma, const float* mean,
                             const float* var, float* dx, float* dgamma, float* dbeta) {
  const double m = static_cast<double>(s.n) * s.hw;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) {
    const double mu = mean[ch], inv = 1.0 / std::sqrt(static_cast<double>(var[ch]) + epsilon);
    Lanes sum_dy, sum_dy_xhat;
    // With a fused ReLU, the channel's dy masked where y is not positive, once, into a buffer of
    // this thread's that the second pass reads again: a plain select the compiler vectorizes.
    thread_local std::vector<float> masked;
    if (s.relu) masked.resize(static_cast<size_t>(s.n) * s.hw);
    auto dy_of = [&](int i) -> const float* {
      return s.relu ? masked.data() + static_cast<size_t>(i) * s.hw : dy + at(s, i, ch);
    };
    if (s.relu) {
      for (int i = 0; i < s.n; ++i) {
        const float* dyi = dy + at(s, i, ch);
        const float* yi = y + at(s, i, ch);
        float* r = masked.data() + static_cast<size_t>(i) * s.hw;
#pragma omp simd
        for (int p = 0; p < s.hw; ++p) {
          const float d = dyi[p], v = yi[p];  // both read, so the select needs no branch
          r[p] = v > 0.0f ? d : 0.0f;
        }
      }
    }
    for (int i = 0; i < s.n; ++i) {
      const float* dyi = dy_of(i);
      sum_dy.add(dyi, s.hw);
      sum_dy_xhat.add_products(dyi, x + at(s, i, ch), s.hw, mu, inv);
    }
    const double total_dy = sum_dy.total(), total_dy_xhat = sum_dy_xhat.total();
    if (dbeta) dbeta[ch] = static_cast<float>(total_dy);
    if (dgamma) dgamma[ch] = static_cast<float>(total_dy_xhat);
    if (!dx) continue;
    const double g = (gamma ? gamma[ch] : 1.0) * inv;
    const double mean_dy = total_dy / m, mean_dy_xhat = total_dy_xhat / m;
    for (int i = 0; i < s.n; ++i) {
      const float* xi = x + at(s, i, ch);
      const float* dyi = dy_of(i);
      float* dxi = dx + at(s, i, ch);
#pragma omp simd
      for (int p = 0; p < s.hw; ++p) {
        double xhat = (xi[p] - mu) * inv;
        dxi[p] = static_cast<float>(g * (dyi[p] - mean_dy - xhat * mean_dy_xhat));
      }
    }
  }
}

}  // namespace dtrain::nn
