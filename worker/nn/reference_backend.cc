// The naive reference backend: plain nested loops that follow backend.h's definitions literally,
// summing in double and storing float once per output. It is the oracle the oneDNN and CUDA
// backends are tested against, so it is written for obviousness, not speed, and is never used to
// train. Its max-pooling workspace is one int32 per output: the argmax's index in its (n, c) plane.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "worker/nn/host_backend.h"

namespace dtrain::nn {
namespace {

size_t conv_x_index(const ConvShape& s, int n, int c, int y, int x) {
  return ((static_cast<size_t>(n) * s.c + c) * s.h + y) * s.w + x;
}
size_t conv_w_index(const ConvShape& s, int k, int c, int ky, int kx) {
  return ((static_cast<size_t>(k) * s.c + c) * s.kh + ky) * s.kw + kx;
}
size_t conv_y_index(const ConvShape& s, int n, int k, int oy, int ox) {
  return ((static_cast<size_t>(n) * s.k + k) * s.oh() + oy) * s.ow() + ox;
}

void check_conv_shape(const ConvShape& s) {
  DT_ENFORCE(s.n > 0 && s.c > 0 && s.h > 0 && s.w > 0 && s.k > 0 && s.kh > 0 && s.kw > 0,
             "conv shape n={} c={} h={} w={} k={} kh={} kw={}", s.n, s.c, s.h, s.w, s.k, s.kh,
             s.kw);
  DT_ENFORCE(s.sh > 0 && s.sw > 0, "conv strides {}x{}", s.sh, s.sw);
  DT_ENFORCE(s.pad_top >= 0 && s.pad_bottom >= 0 && s.pad_left >= 0 && s.pad_right >= 0,
             "negative conv padding");
  DT_ENFORCE(s.oh() > 0 && s.ow() > 0, "conv output {}x{}", s.oh(), s.ow());
}

void check_pool_shape(const PoolShape& s) {
  DT_ENFORCE(s.n > 0 && s.c > 0 && s.h > 0 && s.w > 0, "pool input {}x{}x{}x{}", s.n, s.c, s.h,
             s.w);
  DT_ENFORCE(s.kh > 0 && s.kw > 0 && s.sh > 0 && s.sw > 0, "pool window {}x{} stride {}x{}", s.kh,
             s.kw, s.sh, s.sw);
  DT_ENFORCE(s.pad_top >= 0 && s.pad_bottom >= 0 && s.pad_left >= 0 && s.pad_right >= 0 &&
                 s.pad_top < s.kh && s.pad_bottom < s.kh && s.pad_left < s.kw && s.pad_right < s.kw,
             "pool padding {}/{} {}/{} for a {}x{} window", s.pad_top, s.pad_bottom, s.pad_left,
             s.pad_right, s.kh, s.kw);
  DT_ENFORCE(s.kh <= s.h + s.pad_top + s.pad_bottom && s.kw <= s.w + s.pad_left + s.pad_right,
             "pool window {}x{} exceeds input {}x{}", s.kh, s.kw, s.h, s.w);
}

/// Calls f(plane index) for each element of output (oy, ox)'s window inside the input, in
/// row-major order.
template <class F>
void for_window(const PoolShape& s, int oy, int ox, F f) {
  for (int ky = 0; ky < s.kh; ++ky) {
    const int iy = oy * s.sh - s.pad_top + ky;
    if (iy < 0 || iy >= s.h) continue;
    for (int kx = 0; kx < s.kw; ++kx) {
      const int ix = ox * s.sw - s.pad_left + kx;
      if (ix >= 0 && ix < s.w) f(iy * s.w + ix);
    }
  }
}

/// f(x) and f'(x) of an activation, in double.
double eltwise_value(Eltwise f, double x) {
  switch (f) {
    case Eltwise::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case Eltwise::kTanh:
      return std::tanh(x);
    case Eltwise::kGelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Eltwise::kSwish:
      return x / (1.0 + std::exp(-x));
  }
  return 0.0;
}
double eltwise_slope(Eltwise f, double x) {
  const double sigmoid = 1.0 / (1.0 + std::exp(-x));
  switch (f) {
    case Eltwise::kSigmoid:
      return sigmoid * (1.0 - sigmoid);
    case Eltwise::kTanh:
      return 1.0 - std::tanh(x) * std::tanh(x);
    case Eltwise::kGelu:
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * 3.14159265358979323846);
    case Eltwise::kSwish:
      return sigmoid + x * sigmoid * (1.0 - sigmoid);
  }
  return 0.0;
}

/// The input row (or column) that output position o and kernel tap t read, before bounds checks.
int input_pos(int o, int stride, int pad, int t) {
  return o * stride - pad + t;
}

// Calls f(k) for every index k of channel ch, example by example.
template <class F>
void for_channel(const NormShape& s, int ch, F f) {
  for (int i = 0; i < s.n; ++i) {
    const size_t base = (size_t(i) * s.c + ch) * size_t(s.hw);
    for (int p = 0; p < s.hw; ++p) f(base + p);
  }
}

class ReferenceBackend : public HostBackend {
 public:
  std::string name() const override { return "reference"; }

  void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                      float* y) override {
    check_conv_shape(s);
    for (int n = 0; n < s.n; ++n)
      for (int k = 0; k < s.k; ++k)
        for (int oy = 0; oy < s.oh(); ++oy)
          for (int ox = 0; ox < s.ow(); ++ox) {
            double sum = b[k];
            for (int c = 0; c < s.c; ++c)
              for (int ky = 0; ky < s.kh; ++ky)
                for (int kx = 0; kx < s.kw; ++kx) {
                  int iy = input_pos(oy, s.sh, s.pad_top, ky);
                  int ix = input_pos(ox, s.sw, s.pad_left, kx);
                  if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;  // zero padding
                  sum +=
                      double{x[conv_x_index(s, n, c, iy, ix)]} * w[conv_w_index(s, k, c, ky, kx)];
                }
            y[conv_y_index(s, n, k, oy, ox)] = static_cast<float>(sum);
          }
  }

  /// Scatters every dy * w product into a double copy of dx, then stores it.
  void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                            float* dx) override {
    check_conv_shape(s);
    std::vector<double> acc(s.input_count(), 0.0);
    for (int n = 0; n < s.n; ++n)
      for (int k = 0; k < s.k; ++k)
        for (int oy = 0; oy < s.oh(); ++oy)
          for (int ox = 0; ox < s.ow(); ++ox) {
            double g = dy[conv_y_index(s, n, k, oy, ox)];
            for (int c = 0; c < s.c; ++c)
              for (int ky = 0; ky < s.kh; ++ky)
                for (int kx = 0; kx < s.kw; ++kx) {
                  int iy = input_pos(oy, s.sh, s.pad_top, ky);
                  int ix = input_pos(ox, s.sw, s.pad_left, kx);
                  if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                  acc[conv_x_index(s, n, c, iy, ix)] += g * w[conv_w_index(s, k, c, ky, kx)];
                }
          }
    std::transform(acc.begin(), acc.end(), dx, [](double v) { return static_cast<float>(v); });
  }

  void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                               float* db) override {
    check_conv_shape(s);
    for (int k = 0; k < s.k; ++k) {
      for (int c = 0; c < s.c; ++c)
        for (int ky = 0; ky < s.kh; ++ky)
          for (int kx = 0; kx < s.kw; ++kx)
            dw[conv_w_index(s, k, c, ky, kx)] = conv_weight_gradient(s, x, dy, k, c, ky, kx);
      double bias_sum = 0.0;
      for (int n = 0; n < s.n; ++n)
        for (int oy = 0; oy < s.oh(); ++oy)
          for (int ox = 0; ox < s.ow(); ++ox) bias_sum += dy[conv_y_index(s, n, k, oy, ox)];
      db[k] = static_cast<float>(bias_sum);
    }
  }

  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override {
    check_dense(n, in, out);
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < out; ++o) {
        double sum = b[o];
        for (int j = 0; j < in; ++j) sum += double{x[idx(i, in, j)]} * w[idx(j, out, o)];
        y[idx(i, out, o)] = static_cast<float>(sum);
      }
  }

  void dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                           float* dx) override {
    check_dense(n, in, out);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < in; ++j) {
        double sum = 0.0;
        for (int o = 0; o < out; ++o) sum += double{dy[idx(i, out, o)]} * w[idx(j, out, o)];
        dx[idx(i, in, j)] = static_cast<float>(sum);
      }
  }

  void dense_backward_weights(int n, int in, int out, const float* x, const float* dy, float* dw,
                              float* db) override {
    dense_backward_weight_rows(n, in, out, x, dy, dw, 0, in);
    dense_backward_bias(n, out, dy, db);
  }

  void dense_backward_weight_rows(int n, int in, int out, const float* x, const float* dy,
                                  float* dw, int row_begin, int row_end) override {
    check_dense(n, in, out);
    DT_ENFORCE(0 <= row_begin && row_begin <= row_end && row_end <= in, "rows {}..{} of {}",
               row_begin, row_end, in);
    for (int j = row_begin; j < row_end; ++j)
      for (int o = 0; o < out; ++o) {
        double sum = 0.0;
        for (int i = 0; i < n; ++i) sum += double{x[idx(i, in, j)]} * dy[idx(i, out, o)];
        dw[idx(j, out, o)] = static_cast<float>(sum);
      }
  }

  void dense_backward_bias(int n, int out, const float* dy, float* db) override {
    for (int o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int i = 0; i < n; ++i) sum += dy[idx(i, out, o)];
      db[o] = static_cast<float>(sum);
    }
  }

  void relu_forward(size_t count, const float* x, float* y) override {
    for (size_t i = 0; i < count; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }

  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override {
    for (size_t i = 0; i < count; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }

  // Batch normalization the plain way: statistics in double, xhat element by element.
  void batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                  const float* gamma, const float* beta, float* y, float* mean,
                                  float* var) override {
    for (int ch = 0; ch < s.c; ++ch) {
      double sum = 0, squares = 0;
      for_channel(s, ch, [&](size_t k) { sum += x[k]; });
      const double mu = sum / (double(s.n) * s.hw);
      for_channel(s, ch, [&](size_t k) { squares += (x[k] - mu) * (x[k] - mu); });
      mean[ch] = static_cast<float>(mu);
      var[ch] = static_cast<float>(squares / (double(s.n) * s.hw));
    }
    batchnorm_forward_inference(s, epsilon, x, gamma, beta, mean, var, y);
  }
  void batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                   const float* gamma, const float* beta, const float* mean,
                                   const float* var, float* y) override {
    for (int ch = 0; ch < s.c; ++ch) {
      const double inv = 1.0 / std::sqrt(double(var[ch]) + epsilon);
      const double g = gamma ? gamma[ch] : 1.0, b = beta ? beta[ch] : 0.0;
      for_channel(s, ch, [&](size_t k) {
        y[k] = float((x[k] - double(mean[ch])) * inv * g + b);
        if (s.relu) y[k] = y[k] > 0.0f ? y[k] : 0.0f;
      });
    }
  }
  void batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                          const float* dy_out, const float* gamma, const float* mean,
                          const float* var, float* dx, float* dgamma, float* dbeta) override {
    const double m = double(s.n) * s.hw;
    std::vector<float> masked;
    const float* dy = dy_out;
    if (s.relu) {
      masked.resize(s.count());
      for (size_t k = 0; k < s.count(); ++k) masked[k] = y[k] > 0.0f ? dy_out[k] : 0.0f;
      dy = masked.data();
    }
    for (int ch = 0; ch < s.c; ++ch) {
      const double inv = 1.0 / std::sqrt(double(var[ch]) + epsilon);
      auto xhat = [&](size_t k) { return (x[k] - double(mean[ch])) * inv; };
      double sum_dy = 0, sum_dy_xhat = 0;
      for_channel(s, ch, [&](size_t k) {
        sum_dy += dy[k];
        sum_dy_xhat += dy[k] * xhat(k);
      });
      if (dbeta) dbeta[ch] = float(sum_dy);
      if (dgamma) dgamma[ch] = float(sum_dy_xhat);
      const double g = (gamma ? gamma[ch] : 1.0) * inv;
      if (dx)
        for_channel(s, ch, [&](size_t k) {
          dx[k] = float(g * (dy[k] - sum_dy / m - xhat(k) * sum_dy_xhat / m));
        });
    }
  }
  void batchnorm_sums(const NormShape& s, const float* x, const float* center,
                      float* sums) override {
    for (int ch = 0; ch < s.c; ++ch) {
      double sum = 0;
      if (center)
        for_channel(s, ch, [&](size_t k) {
          sum += (x[k] - double(center[ch])) * (x[k] - double(center[ch]));
        });
      else
        for_channel(s, ch, [&](size_t k) { sum += x[k]; });
      sums[ch] = float(sum);
    }
  }
  void batchnorm_backward_data(const NormShape& s, float epsilon, const float* x, const float* y,
                               const float* dy_out, const float* gamma, const float* mean,
                               const float* var, const float* totals, double count,
                               float* dx) override {
    for (int ch = 0; ch < s.c; ++ch) {
      const double inv = 1.0 / std::sqrt(double(var[ch]) + epsilon);
      const double g = (gamma ? gamma[ch] : 1.0) * inv;
      const double mean_dy = totals[ch] / count, mean_dy_xhat = totals[s.c + ch] / count;
      for_channel(s, ch, [&](size_t k) {
        const double dy = s.relu && !(y[k] > 0.0f) ? 0.0 : double(dy_out[k]);
        const double xhat = (x[k] - double(mean[ch])) * inv;
        dx[k] = float(g * (dy - mean_dy - xhat * mean_dy_xhat));
      });
    }
  }

  // Attention the textbook way: each score in double, each row's softmax, each product summed in
  // double.
  void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                         float* probs, float* y) override {
    const size_t qr = s.qk_stride(), vr = s.v_stride(), yr = s.y_stride();
    for (int b = 0; b < s.n; ++b) {
      for (int h = 0; h < s.heads; ++h) {
        for (int i = 0; i < s.t; ++i) {
          const float* qi = q + (static_cast<size_t>(b) * s.t + i) * qr + h * s.key_dim;
          float* p = probs + ((static_cast<size_t>(b) * s.heads + h) * s.t + i) * s.t;
          const int keys = s.causal ? i + 1 : s.t;
          std::vector<double> score(static_cast<size_t>(keys));
          double top = -INFINITY, total = 0;
          for (int j = 0; j < keys; ++j) {
            const float* kj = k + (static_cast<size_t>(b) * s.t + j) * qr + h * s.key_dim;
            double dot = 0;
            for (int c = 0; c < s.key_dim; ++c) dot += double(qi[c]) * kj[c];
            score[j] = dot * s.scale;
            top = std::max(top, score[j]);
          }
          for (int j = 0; j < keys; ++j) total += (score[j] = std::exp(score[j] - top));
          for (int j = 0; j < s.t; ++j) p[j] = j < keys ? static_cast<float>(score[j] / total) : 0;
          float* yi = y + (static_cast<size_t>(b) * s.t + i) * yr + h * s.value_dim;
          const size_t row = ((static_cast<size_t>(b) * s.heads + h) * s.t + i) * s.t;
          for (int c = 0; c < s.value_dim; ++c) {
            double sum = 0;
            for (int j = 0; j < keys; ++j)
              sum += double(p[j]) * attention_keep(s, row + j) *
                     v[(static_cast<size_t>(b) * s.t + j) * vr + h * s.value_dim + c];
            yi[c] = static_cast<float>(sum);
          }
        }
      }
    }
  }
  void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                          const float* probs, const float* dy, float* dq, float* dk,
                          float* dv) override {
    const size_t qr = s.qk_stride(), vr = s.v_stride(), yr = s.y_stride();
    auto at = [&](int b, int i, int h, size_t row, int dim) {
      return (static_cast<size_t>(b) * s.t + i) * row + static_cast<size_t>(h) * dim;
    };
    for (int b = 0; b < s.n; ++b)  // each head's features of each position (q, k, v may share rows)
      for (int i = 0; i < s.t; ++i)
        for (int h = 0; h < s.heads; ++h) {
          std::fill_n(dq + at(b, i, h, qr, s.key_dim), s.key_dim, 0.0f);
          std::fill_n(dk + at(b, i, h, qr, s.key_dim), s.key_dim, 0.0f);
          std::fill_n(dv + at(b, i, h, vr, s.value_dim), s.value_dim, 0.0f);
        }
    for (int b = 0; b < s.n; ++b) {
      for (int h = 0; h < s.heads; ++h) {
        for (int i = 0; i < s.t; ++i) {
          const float* p = probs + ((static_cast<size_t>(b) * s.heads + h) * s.t + i) * s.t;
          const int keys = s.causal ? i + 1 : s.t;
          std::vector<double> dp(static_cast<size_t>(keys));
          const size_t row = ((static_cast<size_t>(b) * s.heads + h) * s.t + i) * s.t;
          double dot = 0;
          for (int j = 0; j < keys; ++j) {
            for (int c = 0; c < s.value_dim; ++c)
              dp[j] += double(dy[at(b, i, h, yr, s.value_dim) + c]) *
                       v[at(b, j, h, vr, s.value_dim) + c];
            dp[j] *= attention_keep(s, row + j);  // through the dropout's mask
            dot += p[j] * dp[j];
          }
          for (int j = 0; j < keys; ++j) {
            const double ds = p[j] * (dp[j] - dot) * s.scale;
            const double kept = double(p[j]) * attention_keep(s, row + j);
            for (int c = 0; c < s.value_dim; ++c)
              dv[at(b, j, h, vr, s.value_dim) + c] +=
                  static_cast<float>(kept * double(dy[at(b, i, h, yr, s.value_dim) + c]));
            for (int c = 0; c < s.key_dim; ++c) {
              dq[at(b, i, h, qr, s.key_dim) + c] +=
                  static_cast<float>(ds * k[at(b, j, h, qr, s.key_dim) + c]);
              dk[at(b, j, h, qr, s.key_dim) + c] +=
                  static_cast<float>(ds * q[at(b, i, h, qr, s.key_dim) + c]);
            }
          }
        }
      }
    }
  }
  // The embedding: a copy per token, and its gradient added token by token.
  void embedding_forward(int rows, int input_dim, int output_dim, const float* ids,
                         const float* table, float* y) override {
    for (int r = 0; r < rows; ++r) {
      const int id = token_id(ids, r, input_dim);
      for (int j = 0; j < output_dim; ++j) y[idx(r, output_dim, j)] = table[idx(id, output_dim, j)];
    }
  }
  void embedding_backward(int rows, int input_dim, int output_dim, const float* ids,
                          const float* dy, float* dtable) override {
    std::fill(dtable, dtable + static_cast<size_t>(input_dim) * output_dim, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const int id = token_id(ids, r, input_dim);
      for (int j = 0; j < output_dim; ++j)
        dtable[idx(id, output_dim, j)] += dy[idx(r, output_dim, j)];
    }
  }
  // Layer normalization the plain way: each row's statistics in double, y element by element.
  void layernorm_forward(int rows, int features, float epsilon, const float* x, const float* gamma,
                         const float* beta, float* y, float* mean, float* rstd) override {
    for (int r = 0; r < rows; ++r) {
      double sum = 0, squares = 0;
      for (int j = 0; j < features; ++j) sum += x[idx(r, features, j)];
      const double mu = sum / features;
      for (int j = 0; j < features; ++j)
        squares += (x[idx(r, features, j)] - mu) * (x[idx(r, features, j)] - mu);
      const double inv = 1.0 / std::sqrt(squares / features + epsilon);
      mean[r] = static_cast<float>(mu);
      rstd[r] = static_cast<float>(inv);
      for (int j = 0; j < features; ++j) {
        const double g = gamma ? gamma[j] : 1.0, b = beta ? beta[j] : 0.0;
        y[idx(r, features, j)] = static_cast<float>((x[idx(r, features, j)] - mu) * inv * g + b);
      }
    }
  }
  void layernorm_backward(int rows, int features, const float* x, const float* dy,
                          const float* gamma, const float* mean, const float* rstd, float* dx,
                          float* dgamma, float* dbeta) override {
    auto xhat = [&](int r, int j) {
      return (x[idx(r, features, j)] - double(mean[r])) * double(rstd[r]);
    };
    for (int j = 0; j < features; ++j) {
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int r = 0; r < rows; ++r) {
        sum_dy += dy[idx(r, features, j)];
        sum_dy_xhat += dy[idx(r, features, j)] * xhat(r, j);
      }
      if (dbeta) dbeta[j] = static_cast<float>(sum_dy);
      if (dgamma) dgamma[j] = static_cast<float>(sum_dy_xhat);
    }
    if (!dx) return;
    for (int r = 0; r < rows; ++r) {
      double sum_g = 0, sum_g_xhat = 0;
      for (int j = 0; j < features; ++j) {
        const double g = double(dy[idx(r, features, j)]) * (gamma ? gamma[j] : 1.0);
        sum_g += g;
        sum_g_xhat += g * xhat(r, j);
      }
      for (int j = 0; j < features; ++j) {
        const double g = double(dy[idx(r, features, j)]) * (gamma ? gamma[j] : 1.0);
        dx[idx(r, features, j)] = static_cast<float>(
            double(rstd[r]) * (g - sum_g / features - xhat(r, j) * sum_g_xhat / features));
      }
    }
  }

  size_t maxpool_workspace_bytes(const PoolShape& s) override {
    check_pool_shape(s);
    return static_cast<size_t>(s.n) * s.c * s.oh() * s.ow() * sizeof(int32_t);
  }

  /// Scans each window's elements inside the input in row-major order and keeps the first
  /// maximum.
  void maxpool_forward(const PoolShape& s, const float* x, float* y, void* workspace) override {
    check_pool_shape(s);
    auto* argmax = static_cast<int32_t*>(workspace);
    const size_t plane = static_cast<size_t>(s.h) * s.w;
    size_t out = 0;
    for (size_t nc = 0; nc < static_cast<size_t>(s.n) * s.c; ++nc) {
      const float* xp = x + nc * plane;
      for (int oy = 0; oy < s.oh(); ++oy)
        for (int ox = 0; ox < s.ow(); ++ox, ++out) {
          int best = -1;
          for_window(s, oy, ox, [&](int at) {
            if (best < 0 || xp[at] > xp[best]) best = at;
          });
          DT_ENFORCE(best >= 0, "pool window ({}, {}) outside the input", oy, ox);
          y[out] = xp[best];
          argmax[out] = best;
        }
    }
  }

  void avgpool_forward(const PoolShape& s, const float* x, float* y) override {
    check_pool_shape(s);
    const size_t plane = static_cast<size_t>(s.h) * s.w;
    size_t out = 0;
    for (size_t nc = 0; nc < static_cast<size_t>(s.n) * s.c; ++nc) {
      const float* xp = x + nc * plane;
      for (int oy = 0; oy < s.oh(); ++oy)
        for (int ox = 0; ox < s.ow(); ++ox, ++out) {
          double sum = 0;
          int count = 0;
          for_window(s, oy, ox, [&](int at) { sum += xp[at], ++count; });
          y[out] = static_cast<float>(sum / count);
        }
    }
  }

  void avgpool_backward(const PoolShape& s, const float* dy, float* dx) override {
    check_pool_shape(s);
    const size_t plane = static_cast<size_t>(s.h) * s.w;
    std::vector<double> acc(static_cast<size_t>(s.n) * s.c * plane, 0.0);
    size_t out = 0;
    for (size_t nc = 0; nc < static_cast<size_t>(s.n) * s.c; ++nc)
      for (int oy = 0; oy < s.oh(); ++oy)
        for (int ox = 0; ox < s.ow(); ++ox, ++out) {
          int count = 0;
          for_window(s, oy, ox, [&](int) { ++count; });
          const double share = double{dy[out]} / count;
          for_window(s, oy, ox, [&](int at) { acc[nc * plane + at] += share; });
        }
    std::transform(acc.begin(), acc.end(), dx, [](double v) { return static_cast<float>(v); });
  }

  void eltwise_forward(Eltwise f, size_t count, const float* x, float* y) override {
    for (size_t i = 0; i < count; ++i) y[i] = static_cast<float>(eltwise_value(f, x[i]));
  }
  void eltwise_backward(Eltwise f, size_t count, const float* x, const float* dy,
                        float* dx) override {
    for (size_t i = 0; i < count; ++i)
      dx[i] = static_cast<float>(double{dy[i]} * eltwise_slope(f, x[i]));
  }

  void maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                        float* dx) override {
    check_pool_shape(s);
    const auto* argmax = static_cast<const int32_t*>(workspace);
    const size_t plane = static_cast<size_t>(s.h) * s.w;
    const size_t out_plane = static_cast<size_t>(s.oh()) * s.ow();
    std::vector<double> acc(static_cast<size_t>(s.n) * s.c * plane, 0.0);
    for (size_t nc = 0; nc < static_cast<size_t>(s.n) * s.c; ++nc)
      for (size_t o = 0; o < out_plane; ++o) {
        int32_t at = argmax[nc * out_plane + o];
        DT_ENFORCE(at >= 0 && static_cast<size_t>(at) < plane, "pool argmax {} out of range", at);
        acc[nc * plane + at] += dy[nc * out_plane + o];
      }
    std::transform(acc.begin(), acc.end(), dx, [](double v) { return static_cast<float>(v); });
  }

  void softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                             float* dlogits, float* totals) override {
    DT_ENFORCE(n > 0 && classes > 0, "softmax cross-entropy of {} rows, {} classes", n, classes);
    double loss_sum = 0.0;
    int correct = 0;
    for (int i = 0; i < n; ++i) {
      loss_sum += softmax_row(n, classes, logits + idx(i, classes, 0), labels[i],
                              dlogits ? dlogits + idx(i, classes, 0) : nullptr, &correct);
    }
    totals[0] = static_cast<float>(totals[0] + loss_sum);
    totals[1] += static_cast<float>(correct);
    totals[2] += static_cast<float>(n);
  }

  void sgd_update(const SgdParams& gated_params, size_t count, float* w, const float* g,
                  float* velocity) override {
    SgdParams p = gated_params;
    if (!gated(p)) return;
    const double lr = p.learning_rate, momentum = p.momentum;
    if (p.momentum == 0.0f) {
      for (size_t i = 0; i < count; ++i) w[i] = static_cast<float>(w[i] - lr * g[i]);
      return;
    }
    DT_ENFORCE(velocity != nullptr, "SGD with momentum {} needs a velocity buffer", p.momentum);
    for (size_t i = 0; i < count; ++i) {
      double v = momentum * velocity[i] - lr * g[i];
      velocity[i] = static_cast<float>(v);
      double step = p.nesterov ? momentum * v - lr * g[i] : v;
      w[i] = static_cast<float>(w[i] + step);
    }
  }

  void adam_update(const AdamParams& gated_params, int64_t step, size_t count, float* w,
                   const float* g, float* m, float* v) override {
    AdamParams p = gated_params;
    if (!gated(p, &step)) return;
    DT_ENFORCE(step >= 1, "Adam step {} (steps count from 1)", step);
    const double b1 = p.beta_1, b2 = p.beta_2, eps = p.epsilon;
    const double t = static_cast<double>(step);
    const double lr_t =
        p.learning_rate * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
    for (size_t i = 0; i < count; ++i) {
      double mi = b1 * m[i] + (1.0 - b1) * g[i];
      double vi = b2 * v[i] + (1.0 - b2) * double{g[i]} * g[i];
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
      w[i] = static_cast<float>(w[i] - lr_t * mi / (std::sqrt(vi) + eps));
    }
  }

  void rmsprop_update(const RmspropParams& gated_params, size_t count, float* w, const float* g,
                      float* velocity, float* momentum_slot, float* average_gradient) override {
    RmspropParams p = gated_params;
    if (!gated(p)) return;
    DT_ENFORCE(p.momentum <= 0.0f || momentum_slot != nullptr, "RMSprop momentum without a slot");
    DT_ENFORCE(!p.centered || average_gradient != nullptr, "centered RMSprop without a slot");
    const double lr = p.learning_rate, rho = p.rho, eps = p.epsilon;
    for (size_t i = 0; i < count; ++i) {
      double v = rho * velocity[i] + (1.0 - rho) * double{g[i]} * g[i];
      velocity[i] = static_cast<float>(v);
      double denominator = v + eps;
      if (p.centered) {
        double a = rho * average_gradient[i] + (1.0 - rho) * g[i];
        average_gradient[i] = static_cast<float>(a);
        denominator = v - a * a + eps;
      }
      double increment = lr * g[i] / std::sqrt(denominator);
      if (p.momentum > 0.0f) {
        double mom = double{p.momentum} * momentum_slot[i] + increment;
        momentum_slot[i] = static_cast<float>(mom);
        increment = mom;
      }
      w[i] = static_cast<float>(w[i] - increment);
    }
  }

  void adamw_update(const AdamWParams& gated_params, int64_t step, size_t count, float* w,
                    const float* g, float* m, float* v) override {
    AdamWParams p = gated_params;
    if (!gated(p, &step)) return;
    const double decay = double{p.weight_decay} * p.learning_rate;
    for (size_t i = 0; i < count; ++i) w[i] = static_cast<float>(w[i] - w[i] * decay);
    adam_update({p.learning_rate, p.beta_1, p.beta_2, p.epsilon}, step, count, w, g, m, v);
  }

 private:
  static size_t idx(int row, int width, int col) { return static_cast<size_t>(row) * width + col; }
  /// ids[r] as a row of a table of input_dim rows; EnforceError when it is none.
  static int token_id(const float* ids, int r, int input_dim) {
    const float id = ids[r];
    DT_ENFORCE(id >= 0.0f && id < static_cast<float>(input_dim) && id == std::floor(id),
               "embedding: token {} has id {}, which is not an integer in [0, {}) (input_dim)", r,
               id, input_dim);
    return static_cast<int>(id);
  }

  static void check_dense(int n, int in, int out) {
    DT_ENFORCE(n > 0 && in > 0 && out > 0, "dense shape n={} in={} out={}", n, in, out);
  }

  /// dL/dw[k][c][ky][kx] = sum over n, oy, ox of dy[n][k][oy][ox] * x[n][c][iy][ix].
  static float conv_weight_gradient(const ConvShape& s, const float* x, const float* dy, int k,
                                    int c, int ky, int kx) {
    double sum = 0.0;
    for (int n = 0; n < s.n; ++n)
      for (int oy = 0; oy < s.oh(); ++oy)
        for (int ox = 0; ox < s.ow(); ++ox) {
          int iy = input_pos(oy, s.sh, s.pad_top, ky);
          int ix = input_pos(ox, s.sw, s.pad_left, kx);
          if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
          sum += double{dy[conv_y_index(s, n, k, oy, ox)]} * x[conv_x_index(s, n, c, iy, ix)];
        }
    return static_cast<float>(sum);
  }

  /// One row of softmax cross-entropy: writes (softmax - onehot) / n (unless dz is null), counts a
  /// correct arg-max (the first maximum), and returns the row's loss log(sum exp(z - max)) -
  /// (z[label] - max).
  static double softmax_row(int n, int classes, const float* z, int32_t label, float* dz,
                            int* correct) {
    DT_ENFORCE(label >= 0 && label < classes, "label {} outside [0, {})", label, classes);
    int arg_max = 0;
    for (int j = 1; j < classes; ++j)
      if (z[j] > z[arg_max]) arg_max = j;
    const double max = z[arg_max];
    double sum = 0.0;
    for (int j = 0; j < classes; ++j) sum += std::exp(z[j] - max);
    const double loss = std::log(sum) - (z[label] - max);
    for (int j = 0; dz && j < classes; ++j) {
      double p = std::exp(z[j] - max) / sum;
      dz[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / n);
    }
    if (arg_max == label) ++*correct;
    return loss;
  }
};

/// float32 to the nearest bf16 (ties to even), as a float: what a bf16 product's input holds.
float round_to_bfloat16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return v;  // NaN stays NaN
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// mixed_bfloat16's products (backend.h MathMode): each input rounded to bf16 first, then the
/// float32 reference's exact sums of their exact products.
class RoundingReference final : public ReferenceBackend {
 public:
  std::string name() const override { return "reference (mixed_bfloat16)"; }
  MathMode math_mode() const override { return MathMode::kBfloat16; }
  void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                      float* y) override {
    ReferenceBackend::conv2d_forward(s, rounded(x, s.input_count()), rounded(w, s.weight_count()),
                                     b, y);
  }
  void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                            float* dx) override {
    ReferenceBackend::conv2d_backward_data(s, rounded(dy, s.output_count()),
                                           rounded(w, s.weight_count()), dx);
  }
  void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                               float* db) override {
    // The bias gradient sums the rounded dy too (oneDNN's primitive takes one dy for both).
    ReferenceBackend::conv2d_backward_weights(s, rounded(x, s.input_count()),
                                              rounded(dy, s.output_count()), dw, db);
  }
  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override {
    ReferenceBackend::dense_forward(n, in, out, rounded(x, size(n, in)), rounded(w, size(in, out)),
                                    b, y);
  }
  void dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                           float* dx) override {
    ReferenceBackend::dense_backward_data(n, in, out, rounded(dy, size(n, out)),
                                          rounded(w, size(in, out)), dx);
  }
  void dense_backward_weight_rows(int n, int in, int out, const float* x, const float* dy,
                                  float* dw, int row_begin, int row_end) override {
    ReferenceBackend::dense_backward_weight_rows(n, in, out, rounded(x, size(n, in)),
                                                 rounded(dy, size(n, out)), dw, row_begin, row_end);
  }

 private:
  static size_t size(int rows, int columns) { return static_cast<size_t>(rows) * columns; }
  // A rounded copy of count floats, alive until the next call's copies replace it.
  const float* rounded(const float* source, size_t count) {
    copies_.emplace_back(source, source + count);
    for (float& v : copies_.back()) v = round_to_bfloat16(v);
    if (copies_.size() > 4) copies_.erase(copies_.begin());
    return copies_.back().data();
  }
  std::vector<std::vector<float>> copies_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(MathMode mode) {
  if (mode == MathMode::kBfloat16) return std::make_unique<RoundingReference>();
  DT_ENFORCE(mode != MathMode::kFloat16, "the reference backend has no mixed_float16");
  return std::make_unique<ReferenceBackend>();
}

}  // namespace dtrain::nn
