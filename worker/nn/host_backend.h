// What the two host backends (oneDNN, reference) share: the host device they own and the
// elementwise operations that need no library (add, dropout, multiply, loss scaling, moving
// averages).
// Header-only and small; the convolutions, dense layers and the loss stay in each backend.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>

#include "worker/nn/backend.h"
#include "worker/nn/random.h"

namespace dtrain::nn {

class HostBackend : public Backend {
 public:
  HostBackend() : device_(make_host_device()) {}
  Device& device() override { return *device_; }

  void add(size_t count, const float* x, float* y) override {
    for (size_t i = 0; i < count; ++i) y[i] += x[i];
  }
  void dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                       float* mask) override {
    float scale = 1.0f / (1.0f - rate);
    for (size_t i = 0; i < count; ++i) {
      mask[i] = unit_float(mix64(key ^ i)) >= rate ? scale : 0.0f;
      y[i] = x[i] * mask[i];
    }
  }
  // In double, row by row: a handful of classes, once a step.
  void softmax_cross_entropy_smoothed(int n, int classes, float smoothing, const float* logits,
                                      const int32_t* labels, float* dlogits,
                                      float* totals) override {
    if (smoothing == 0.0f)
      return softmax_cross_entropy(n, classes, logits, labels, dlogits, totals);
    double loss_sum = 0;
    int correct = 0;
    const double off = double(smoothing) / classes, on = 1.0 - smoothing + off;
    for (int i = 0; i < n; ++i) {
      const float* row = logits + static_cast<size_t>(i) * classes;
      const int best = static_cast<int>(std::max_element(row, row + classes) - row);
      correct += best == labels[i];
      double sum = 0, targets_dot = 0;
      for (int k = 0; k < classes; ++k) {
        sum += std::exp(double(row[k]) - row[best]);
        targets_dot += (k == labels[i] ? on : off) * row[k];
      }
      const double lse = row[best] + std::log(sum);
      loss_sum += lse - targets_dot;  // the targets sum to 1
      if (!dlogits) continue;
      for (int k = 0; k < classes; ++k) {
        const double p = std::exp(double(row[k]) - lse);
        dlogits[static_cast<size_t>(i) * classes + k] =
            static_cast<float>((p - (k == labels[i] ? on : off)) / n);
      }
    }
    totals[0] = static_cast<float>(totals[0] + loss_sum);
    totals[1] += static_cast<float>(correct);
    totals[2] += static_cast<float>(n);
  }
  void remap2d_forward(int n, int c, int h, int w, int oh, int ow, const PixelMap* maps,
                       const float* x, float* y) override {
    for_each_pixel(n, c, h, w, oh, ow, maps,
                   [&](size_t out, const size_t* in) { y[out] = in ? x[*in] : 0.0f; });
  }
  void remap2d_backward(int n, int c, int h, int w, int oh, int ow, const PixelMap* maps,
                        const float* dy, float* dx) override {
    std::fill(dx, dx + static_cast<size_t>(n) * c * h * w, 0.0f);
    for_each_pixel(n, c, h, w, oh, ow, maps, [&](size_t out, const size_t* in) {
      if (in) dx[*in] += dy[out];
    });
  }
  void decay_weights(const DecayParams& gated_params, size_t count, float* w) override {
    DecayParams p = gated_params;
    if (!gated(p)) return;
    const float wd = p.weight_decay, lr = p.learning_rate;
    for (size_t i = 0; i < count; ++i) w[i] = w[i] - w[i] * wd * lr;
  }
  void moving_average_update(size_t count, float momentum, int shards, const float* sum,
                             float* moving) override {
    for (size_t i = 0; i < count; ++i)
      moving[i] = moving[i] * momentum + sum[i] / static_cast<float>(shards) * (1.0f - momentum);
  }
  void multiply(size_t count, const float* a, const float* b, float* y) override {
    for (size_t i = 0; i < count; ++i) y[i] = a[i] * b[i];
  }
  void scale(size_t count, const float* factor, float* x) override {
    const float f = *factor;
    for (size_t i = 0; i < count; ++i) x[i] *= f;
  }
  // One pass, vectorised and split over OpenMP's threads (a branch per element kept the compiler
  // from vectorising it: 2.6 ms a step for the tutorial CNN's 2.8M gradients at two threads).
  // |v| <= FLT_MAX is false for an infinity and for NaN alike.
  void unscale_gradients(size_t count, const float* scale_in, float* g, float* nonfinite) override {
    const int64_t n = static_cast<int64_t>(count);
    const float scale = *scale_in;
    int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < n; ++i) {
      g[i] /= scale;
      bad |= !(std::fabs(g[i]) <= FLT_MAX);
    }
    if (nonfinite != nullptr && bad) *nonfinite = 1.0f;
  }
  void update_loss_scale(float* state, int64_t growth_steps) override {
    float& scale = state[kLossScale];
    float& good = state[kGoodSteps];
    if (state[kNonfinite] != 0.0f) {
      scale = std::max(scale / 2, 1.0f);
      good = 0;
      state[kSkipped] += 1;
    } else if ((good += 1) >= static_cast<float>(growth_steps)) {
      good = 0;
      if (std::isfinite(scale * 2)) scale *= 2;
    }
    state[kPreviousSkipped] = state[kNonfinite];
    state[kNonfinite] = 0;
  }

 protected:
  /// Calls f(output index, &input index or null) for every output pixel of remap2d.
  template <class F>
  static void for_each_pixel(int n, int c, int h, int w, int oh, int ow, const PixelMap* maps,
                             F f) {
    for (int i = 0; i < n; ++i) {
      const PixelMap& m = maps[i];
      for (int ch = 0; ch < c; ++ch) {
        const size_t in_plane = (static_cast<size_t>(i) * c + ch) * h * w;
        const size_t out_plane = (static_cast<size_t>(i) * c + ch) * oh * ow;
        for (int r = 0; r < oh; ++r) {
          const int row = m.row0 + r * m.row_step;
          for (int q = 0; q < ow; ++q) {
            const int col = m.col0 + q * m.col_step;
            const size_t out = out_plane + static_cast<size_t>(r) * ow + q;
            if (row < 0 || row >= h || col < 0 || col >= w) {
              f(out, nullptr);
              continue;
            }
            const size_t in = in_plane + static_cast<size_t>(row) * w + col;
            f(out, &in);
          }
        }
      }
    }
  }
  static bool raised(const float* flag) {
    return flag != nullptr && *flag != 0.0f;
  }
  /// The update as its gate has it (docs/design.md#loss-scaling): false when it is skipped; else
  /// p's rate, and Adam's step, put back one step where the step before was skipped.
  template <class Params>
  static bool gated(Params& p, int64_t* step = nullptr) {
    if (raised(p.gate.skip)) return false;
    if (raised(p.gate.previous)) {
      p.learning_rate = p.gate.learning_rate_after_skip;
      if (step != nullptr) --*step;
    }
    return true;
  }

 private:
  std::unique_ptr<Device> device_;
};

}  // namespace dtrain::nn
