// What the two host backends (oneDNN, reference) share: the host device they own and the
// elementwise operations that need no library (add, dropout, multiply, loss scaling, moving
// averages, rescaling, permutations, regularizers and gradient clipping).
// Header-only and small; the convolutions, dense layers and the loss stay in each backend.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/errors.h"
#include "worker/nn/backend.h"
#include "worker/nn/random.h"

namespace dtrain::nn {

class HostBackend : public Backend {
 public:
  HostBackend() : device_(make_host_device()) {}
  Device& device() override { return *device_; }

  /// Vectorised and split over OpenMP's threads, as add_forward (each element's sum is the same
  /// at any width or thread count).
  void add(size_t count, const float* x, float* y) override {
    const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for simd schedule(static) if (n >= (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  /// Two inputs in one pass; more as the default does.
  void add_forward(size_t count, const float* const* x, int inputs, bool relu, float* y) override {
    if (inputs != 2) return Backend::add_forward(count, x, inputs, relu, y);
    const float* a = x[0];
    const float* b = x[1];
    // Vectorised and split over OpenMP's threads (left to itself the compiler branched on the
    // sign, one misprediction in two).
    const int64_t n = static_cast<int64_t>(count);
    if (relu) {
#pragma omp parallel for simd schedule(static) if (n >= (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i) {
        const float v = a[i] + b[i];
        y[i] = v > 0.0f ? v : 0.0f;
      }
    } else {
#pragma omp parallel for simd schedule(static) if (n >= (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    }
  }
  /// In one pass, vectorised and split over OpenMP's threads as add is. The select is a mask of
  /// the sum's bits (+0 where y is not positive): as a plain select the compiler branched on it.
  void relu_backward_added(size_t count, const float* y, const float* dy, const float* addend,
                           float* dx) override {
    const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for simd schedule(static) if (n >= (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
      const float v = dy[i] + addend[i];
      uint32_t bits;
      __builtin_memcpy(&bits, &v, sizeof bits);
      bits &= 0u - static_cast<uint32_t>(y[i] > 0.0f);
      float d;
      __builtin_memcpy(&d, &bits, sizeof d);
      dx[i] = d;
    }
  }
  void dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                       float* mask) override {
    float scale = 1.0f / (1.0f - rate);
    for (size_t i = 0; i < count; ++i) {
      mask[i] = unit_float(mix64(key ^ i)) >= rate ? scale : 0.0f;
      y[i] = x[i] * mask[i];
    }
  }
  void target_loss(const TargetLossShape& s, const float* outputs, const int32_t* targets,
                   float* doutputs, float* totals) override {
    const int k_units = s.units;
    const double per_row = 1.0 / k_units, scale = 1.0 / (double(s.n) * k_units);
    double loss_sum = 0, companion_sum = 0;
    std::vector<double> t(static_cast<size_t>(k_units));
    for (int i = 0; i < s.n; ++i) {
      const float* o = outputs + static_cast<size_t>(i) * k_units;
      float* d = doutputs ? doutputs + static_cast<size_t>(i) * k_units : nullptr;
      for (int k = 0; k < k_units; ++k) {
        float value;
        std::memcpy(&value, targets + static_cast<size_t>(i) * k_units + k, sizeof value);
        t[static_cast<size_t>(k)] = value;
      }
      double row_loss = 0, companion = 0;
      switch (s.loss) {
        case Loss::kCategorical: {
          const double off = double(s.smoothing) / k_units;
          int best = 0, wanted = 0;
          double top = o[0], weight = 0, dot = 0;
          for (int k = 1; k < k_units; ++k) {
            if (o[k] > o[best]) best = k, top = o[k];
            if (t[static_cast<size_t>(k)] > t[static_cast<size_t>(wanted)]) wanted = k;
          }
          double sum = 0;
          for (int k = 0; k < k_units; ++k) {
            double& tk = t[static_cast<size_t>(k)];
            tk = tk * (1.0 - s.smoothing) + off;
            sum += std::exp(double(o[k]) - top);
            weight += tk;
            dot += tk * o[k];
          }
          const double lse = top + std::log(sum);
          row_loss = lse * weight - dot;
          companion = best == wanted ? 1 : 0;
          if (d) {
            for (int k = 0; k < k_units; ++k)
              d[k] = static_cast<float>(
                  (std::exp(double(o[k]) - lse) * weight - t[static_cast<size_t>(k)]) / s.n);
          }
          break;
        }
        case Loss::kBinary: {
          constexpr double kEpsilon = 1e-7;  // Keras's backend epsilon
          for (int k = 0; k < k_units; ++k) {
            const double target =
                t[static_cast<size_t>(k)] * (1.0 - s.smoothing) + 0.5 * s.smoothing;
            const double z = o[k];
            double p, element, grad;
            if (s.from_logits) {
              p = 1.0 / (1.0 + std::exp(-z));
              element = std::max(z, 0.0) - z * target + std::log1p(std::exp(-std::fabs(z)));
              grad = p - target;
            } else {
              p = std::clamp(z, kEpsilon, 1.0 - kEpsilon);
              element = -(target * std::log(p) + (1.0 - target) * std::log(1.0 - p));
              grad = z > kEpsilon && z < 1.0 - kEpsilon ? (p - target) / (p * (1.0 - p)) : 0.0;
            }
            row_loss += element;
            companion += (p > 0.5) == (t[static_cast<size_t>(k)] > 0.5) ? 1 : 0;
            if (d) d[k] = static_cast<float>(grad * scale);
          }
          row_loss *= per_row;
          companion *= per_row;
          break;
        }
        case Loss::kMeanSquared:
        case Loss::kMeanAbsolute: {
          const bool squared = s.loss == Loss::kMeanSquared;
          double squares = 0, absolutes = 0;
          for (int k = 0; k < k_units; ++k) {
            const double e = double(o[k]) - t[static_cast<size_t>(k)];
            squares += e * e;
            absolutes += std::fabs(e);
            if (d) {
              const double grad = squared ? 2 * e : (e > 0) - (e < 0);
              d[k] = static_cast<float>(grad * scale);
            }
          }
          row_loss = (squared ? squares : absolutes) * per_row;
          companion = (squared ? absolutes : squares) * per_row;
          break;
        }
        case Loss::kSparseCategorical:
          DT_ENFORCE(false, "target_loss: sparse categorical cross-entropy takes class indices");
      }
      loss_sum += row_loss;
      companion_sum += companion;
    }
    totals[0] = static_cast<float>(totals[0] + loss_sum);
    totals[1] = static_cast<float>(totals[1] + companion_sum);
    totals[2] += static_cast<float>(s.n);
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
  void scale_shift(size_t count, float scale, float offset, const float* x, float* y) override {
    for (size_t i = 0; i < count; ++i) y[i] = x[i] * scale + offset;
  }
  void permute_forward(int n, int m, const int32_t* index, const float* x, float* y) override {
    for (size_t i = 0; i < static_cast<size_t>(n); ++i)
      for (size_t j = 0; j < static_cast<size_t>(m); ++j) y[i * m + j] = x[i * m + index[j]];
  }
  void permute_backward(int n, int m, const int32_t* index, const float* dy, float* dx) override {
    for (size_t i = 0; i < static_cast<size_t>(n); ++i)
      for (size_t j = 0; j < static_cast<size_t>(m); ++j) dx[i * m + index[j]] = dy[i * m + j];
  }
  void translate2d_forward(const TranslateShape& s, const Shift2d* shifts, const float* x,
                           float* y) override {
    for_each_tap(s, shifts, [&](size_t out, size_t plane, const Tap& row, const Tap& col) {
      float v = 0;
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          const float weight = row.weight[a] * col.weight[b];
          if (weight == 0.0f) continue;
          const bool inside = row.at[a] >= 0 && col.at[b] >= 0;
          v += weight * (inside ? x[plane + static_cast<size_t>(row.at[a]) * s.w + col.at[b]]
                                : s.fill_value);
        }
      y[out] = v;
    });
  }
  void translate2d_backward(const TranslateShape& s, const Shift2d* shifts, const float* dy,
                            float* dx) override {
    std::fill(dx, dx + s.count(), 0.0f);
    for_each_tap(s, shifts, [&](size_t out, size_t plane, const Tap& row, const Tap& col) {
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          const float weight = row.weight[a] * col.weight[b];
          if (weight != 0.0f && row.at[a] >= 0 && col.at[b] >= 0)
            dx[plane + static_cast<size_t>(row.at[a]) * s.w + col.at[b]] += weight * dy[out];
        }
    });
  }
  void decay_weights(const DecayParams& gated_params, size_t count, float* w) override {
    DecayParams p = gated_params;
    if (!gated(p)) return;
    const float wd = p.weight_decay, lr = p.learning_rate;
    for (size_t i = 0; i < count; ++i) w[i] = w[i] - w[i] * wd * lr;
  }
  // The penalty and the squares in double, in index order: the same bits at any thread count.
  void regularize(size_t count, float l1, float l2, const float* w, float* g,
                  float* penalty) override {
    double abs_sum = 0, square_sum = 0;
    for (size_t i = 0; i < count; ++i) {
      abs_sum += std::fabs(w[i]);
      square_sum += double{w[i]} * w[i];
      const float sign = w[i] > 0.0f ? 1.0f : w[i] < 0.0f ? -1.0f : 0.0f;
      g[i] = g[i] + l1 * sign + 2.0f * l2 * w[i];
    }
    *penalty = static_cast<float>(*penalty + l1 * abs_sum + l2 * square_sum);
  }
  void add_penalty(const float* penalty, float* totals) override {
    totals[0] += *penalty * totals[2];
  }
  void sum_squares(size_t count, const float* g, float* sum) override {
    double total = 0;
    for (size_t i = 0; i < count; ++i) total += double{g[i]} * g[i];
    *sum = static_cast<float>(*sum + total);
  }
  void clip_by_norm(size_t count, float clip, bool global, const float* sum, float* g) override {
    const float norm = std::sqrt(*sum);
    if (global) {  // Keras's clip_by_global_norm: NaN for a norm that is not finite
      const float scale = clip * std::min(1.0f / norm, 1.0f / clip) + (norm - norm);
      for (size_t i = 0; i < count; ++i) g[i] *= scale;
      return;
    }
    const float divisor = std::max(norm, clip);  // Keras's _clip_by_norm
    for (size_t i = 0; i < count; ++i) g[i] = g[i] * clip / divisor;
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
  /// Where one output row (or column) of translate2d reads: two input rows and their weights
  /// (nearest: one of weight 1); a row of -1 is outside the input, the fill value (constant).
  struct Tap {
    int at[2] = {-1, -1};
    float weight[2] = {0, 0};
  };
  /// Keras's fill modes on an index of an axis of `size` (-1: the fill value).
  static int fixed_index(int i, int size, FillMode fill) {
    switch (fill) {
      case FillMode::kConstant:
        return i >= 0 && i < size ? i : -1;
      case FillMode::kNearest:
        return std::min(std::max(i, 0), size - 1);
      case FillMode::kWrap:
        return ((i % size) + size) % size;
      case FillMode::kReflect: {  // period 2 size, mirrored about each edge
        const int m = ((i % (2 * size)) + 2 * size) % (2 * size);
        return m < size ? m : 2 * size - 1 - m;
      }
    }
    return -1;
  }
  /// The taps of output position o of an axis of `size` shifted by `shift`: the input at
  /// o - shift (in float, as Keras's coordinates), bilinear or rounded to the nearest.
  static Tap tap(int o, float shift, int size, const TranslateShape& s) {
    const float coordinate = static_cast<float>(o) - shift;
    const float low = std::floor(coordinate);
    Tap t;
    if (!s.bilinear) {
      t.at[0] = fixed_index(static_cast<int>(std::floor(coordinate + 0.5f)), size, s.fill);
      t.weight[0] = 1;
      return t;
    }
    const float fraction = coordinate - low;
    t.at[0] = fixed_index(static_cast<int>(low), size, s.fill);
    t.at[1] = fixed_index(static_cast<int>(low) + 1, size, s.fill);
    t.weight[0] = 1.0f - fraction;
    t.weight[1] = fraction;
    return t;
  }
  /// Calls f(output index, the input plane's start, row tap, column tap) for every output pixel
  /// of translate2d.
  template <class F>
  static void for_each_tap(const TranslateShape& s, const Shift2d* shifts, F f) {
    std::vector<Tap> rows(static_cast<size_t>(s.h)), cols(static_cast<size_t>(s.w));
    for (int i = 0; i < s.n; ++i) {
      for (int r = 0; r < s.h; ++r) rows[static_cast<size_t>(r)] = tap(r, shifts[i].dy, s.h, s);
      for (int q = 0; q < s.w; ++q) cols[static_cast<size_t>(q)] = tap(q, shifts[i].dx, s.w, s);
      for (int ch = 0; ch < s.c; ++ch) {
        const size_t plane = (static_cast<size_t>(i) * s.c + ch) * s.h * s.w;
        for (int r = 0; r < s.h; ++r)
          for (int q = 0; q < s.w; ++q)
            f(plane + static_cast<size_t>(r) * s.w + q, plane, rows[static_cast<size_t>(r)],
              cols[static_cast<size_t>(q)]);
      }
    }
  }
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
