// See host_norm.h. Each channel's loops are compiled for AVX-512, AVX2 and plain x86-64 (the
// build itself targets plain x86-64, whose two double lanes made these passes a fifth of a ResNet
// step), picked at run time as direct_conv.h's are. This file is compiled with
// -ffp-contract=off, so no width fuses a multiply and an add that another does not: every width
// computes the same operations in the same order, and the results are the same bits
// (docs/design.md#batch-normalization).
#include "worker/nn/host_norm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "worker/nn/host_lanes.h"

namespace dtrain::nn {
namespace {

using direct_conv::Vectors;

// Channel ch's block of example i.
DT_INLINE size_t at(const NormShape& s, int i, int ch) {
  return (static_cast<size_t>(i) * s.c + ch) * static_cast<size_t>(s.hw);
}

// y = x * scale + shift over channel ch, for every example (with s.relu, max of that and 0).
DT_INLINE void affine(const NormShape& s, int ch, const float* x, float scale, float shift,
                      float* y) {
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

// gamma / sqrt(var + epsilon) and beta - mean * that, as Keras's batch_normalization folds them.
DT_INLINE void folded(float epsilon, const float* gamma, const float* beta, float mean, float var,
                      int ch, float* scale, float* shift) {
  float inv = 1.0f / std::sqrt(var + epsilon);
  *scale = gamma ? gamma[ch] * inv : inv;
  *shift = (beta ? beta[ch] : 0.0f) - mean * *scale;
}

/// One training forward's arguments, for every channel.
struct Forward {
  const NormShape& s;
  float epsilon;
  const float* x;
  const float* gamma;
  const float* beta;
  float* y;
  float* mean;
  float* var;
};

DT_INLINE void forward_channel_body(const Forward& f, int ch) {
  const NormShape& s = f.s;
  const double m = static_cast<double>(s.n) * s.hw;
  Lanes sum;
  for (int i = 0; i < s.n; ++i) sum.add(f.x + at(s, i, ch), s.hw);
  const double mu = sum.total() / m;
  Lanes squares;
  for (int i = 0; i < s.n; ++i) squares.add_squared_deviations(f.x + at(s, i, ch), s.hw, mu);
  f.mean[ch] = static_cast<float>(mu);
  f.var[ch] = static_cast<float>(squares.total() / m);
  float scale, shift;
  folded(f.epsilon, f.gamma, f.beta, f.mean[ch], f.var[ch], ch, &scale, &shift);
  affine(s, ch, f.x, scale, shift, f.y);
}

/// One inference forward's arguments.
struct Inference {
  const NormShape& s;
  float epsilon;
  const float* x;
  const float* gamma;
  const float* beta;
  const float* mean;
  const float* var;
  float* y;
};

DT_INLINE void inference_channel_body(const Inference& f, int ch) {
  float scale, shift;
  folded(f.epsilon, f.gamma, f.beta, f.mean[ch], f.var[ch], ch, &scale, &shift);
  affine(f.s, ch, f.x, scale, shift, f.y);
}

/// One backward's arguments; masked is the calling thread's buffer of n x hw floats (s.relu).
struct Backward {
  const NormShape& s;
  float epsilon;
  const float* x;
  const float* y;
  const float* dy;
  const float* gamma;
  const float* mean;
  const float* var;
  float* dx;
  float* dgamma;
  float* dbeta;
};

DT_INLINE void backward_channel_body(const Backward& b, int ch, float* masked) {
  const NormShape& s = b.s;
  const double m = static_cast<double>(s.n) * s.hw;
  const double mu = b.mean[ch], inv = 1.0 / std::sqrt(static_cast<double>(b.var[ch]) + b.epsilon);
  Lanes sum_dy, sum_dy_xhat;
  // With a fused ReLU, the channel's dy masked where y is not positive, once, into the thread's
  // buffer that the second pass reads again: a plain select the compiler vectorizes.
  auto dy_of = [&](int i) -> const float* {
    return s.relu ? masked + static_cast<size_t>(i) * s.hw : b.dy + at(s, i, ch);
  };
  if (s.relu) {
    for (int i = 0; i < s.n; ++i) {
      const float* dyi = b.dy + at(s, i, ch);
      const float* yi = b.y + at(s, i, ch);
      float* r = masked + static_cast<size_t>(i) * s.hw;
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
    sum_dy_xhat.add_products(dyi, b.x + at(s, i, ch), s.hw, mu, inv);
  }
  const double total_dy = sum_dy.total(), total_dy_xhat = sum_dy_xhat.total();
  if (b.dbeta) b.dbeta[ch] = static_cast<float>(total_dy);
  if (b.dgamma) b.dgamma[ch] = static_cast<float>(total_dy_xhat);
  if (!b.dx) return;
  const double g = (b.gamma ? b.gamma[ch] : 1.0) * inv;
  const double mean_dy = total_dy / m, mean_dy_xhat = total_dy_xhat / m;
  for (int i = 0; i < s.n; ++i) {
    const float* xi = b.x + at(s, i, ch);
    const float* dyi = dy_of(i);
    float* dxi = b.dx + at(s, i, ch);
#pragma omp simd
    for (int p = 0; p < s.hw; ++p) {
      double xhat = (xi[p] - mu) * inv;
      dxi[p] = static_cast<float>(g * (dyi[p] - mean_dy - xhat * mean_dy_xhat));
    }
  }
}

/// The channel loops compiled for one vector width.
struct Kernels {
  void (*forward)(const Forward&, int);
  void (*inference)(const Inference&, int);
  void (*backward)(const Backward&, int, float*);
};

void forward_plain(const Forward& f, int ch) {
  forward_channel_body(f, ch);
}
void inference_plain(const Inference& f, int ch) {
  inference_channel_body(f, ch);
}
void backward_plain(const Backward& b, int ch, float* masked) {
  backward_channel_body(b, ch, masked);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void forward_avx2(const Forward& f, int ch) {
  forward_channel_body(f, ch);
}
__attribute__((target("avx2"))) void inference_avx2(const Inference& f, int ch) {
  inference_channel_body(f, ch);
}
__attribute__((target("avx2"))) void backward_avx2(const Backward& b, int ch, float* masked) {
  backward_channel_body(b, ch, masked);
}
__attribute__((target("avx512f"))) void forward_avx512(const Forward& f, int ch) {
  forward_channel_body(f, ch);
}
__attribute__((target("avx512f"))) void inference_avx512(const Inference& f, int ch) {
  inference_channel_body(f, ch);
}
__attribute__((target("avx512f"))) void backward_avx512(const Backward& b, int ch, float* masked) {
  backward_channel_body(b, ch, masked);
}
#endif

Kernels kernels_for(Vectors vectors) {
  if (vectors == Vectors::kWidest) vectors = direct_conv::widest();
  DT_ENFORCE(direct_conv::runs(vectors), "this CPU cannot run batch normalization's {} loops",
             direct_conv::vectors_name(vectors));
  switch (vectors) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx512:
      return {forward_avx512, inference_avx512, backward_avx512};
    case Vectors::kAvx2:
      return {forward_avx2, inference_avx2, backward_avx2};
#endif
    default:
      return {forward_plain, inference_plain, backward_plain};
  }
}

}  // namespace

void host_batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                     const float* gamma, const float* beta, float* y, float* mean,
                                     float* var, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const Forward f{s, epsilon, x, gamma, beta, y, mean, var};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) kernels.forward(f, ch);
}

void host_batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                      const float* gamma, const float* beta, const float* mean,
                                      const float* var, float* y, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const Inference f{s, epsilon, x, gamma, beta, mean, var, y};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) kernels.inference(f, ch);
}

void host_batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                             const float* dy, const float* gamma, const float* mean,
                             const float* var, float* dx, float* dgamma, float* dbeta,
                             Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const Backward b{s, epsilon, x, y, dy, gamma, mean, var, dx, dgamma, dbeta};
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < s.c; ++ch) {
    thread_local std::vector<float> masked;
    if (s.relu) masked.resize(static_cast<size_t>(s.n) * s.hw);
    kernels.backward(b, ch, masked.data());
  }
}

}  // namespace dtrain::nn
