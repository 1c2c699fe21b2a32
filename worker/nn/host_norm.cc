// See host_norm.h.
#include "worker/nn/host_norm.h"

#include <cmath>
#include <cstdint>

namespace dtrain::nn {
namespace {

// Channel ch's block of example i.
inline size_t at(const NormShape& s, int i, int ch) {
  return (static_cast<size_t>(i) * s.c + ch) * static_cast<size_t>(s.hw);
}

// y = x * scale + shift over channel ch, for every example.
void affine(const NormShape& s, int ch, const float* x, float scale, float shift, float* y) {
  for (int i = 0; i < s.n; ++i) {
    const float* xi = x + at(s, i, ch);
    float* yi = y + at(s, i, ch);
#pragma omp simd
    for (int p = 0; p < s.hw; ++p) yi[p] = xi[p] * scale + shift;
  }
}

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
    double sum = 0;
    for (int i = 0; i < s.n; ++i) {
      const float* xi = x + at(s, i, ch);
      for (int p = 0; p < s.hw; ++p) sum += xi[p];
    }
    const double mu = sum / m;
    double squares = 0;
    for (int i = 0; i < s.n; ++i) {
      const float* xi = x + at(s, i, ch);
      for (int p = 0; p < s.hw; ++p) {
        double d = xi[p] - mu;
        squares += d * d;
      }
    }
    mean[ch] = static_cast<float>(mu);
    var[ch] = static_cast<float>(squares / m);
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

void host_batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* dy,
                             const float* gamma, const float* mean, const float* var, float* dx,
                             float* dgamma, float* dbeta) {
  const double m = static_cast<double>(s.n) * s.hw;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) {
    const double mu = mean[ch], inv = 1.0 / std::sqrt(static_cast<double>(var[ch]) + epsilon);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int i = 0; i < s.n; ++i) {
      const float* xi = x + at(s, i, ch);
      const float* dyi = dy + at(s, i, ch);
      for (int p = 0; p < s.hw; ++p) {
        sum_dy += dyi[p];
        sum_dy_xhat += dyi[p] * ((xi[p] - mu) * inv);
      }
    }
    if (dbeta) dbeta[ch] = static_cast<float>(sum_dy);
    if (dgamma) dgamma[ch] = static_cast<float>(sum_dy_xhat);
    if (!dx) continue;
    const double g = (gamma ? gamma[ch] : 1.0) * inv;
    const double mean_dy = sum_dy / m, mean_dy_xhat = sum_dy_xhat / m;
    for (int i = 0; i < s.n; ++i) {
      const float* xi = x + at(s, i, ch);
      const float* dyi = dy + at(s, i, ch);
      float* dxi = dx + at(s, i, ch);
      for (int p = 0; p < s.hw; ++p) {
        double xhat = (xi[p] - mu) * inv;
        dxi[p] = static_cast<float>(g * (dyi[p] - mean_dy - xhat * mean_dy_xhat));
      }
    }
  }
}

}  // namespace dtrain::nn
