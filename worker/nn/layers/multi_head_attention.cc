// Keras's MultiHeadAttention as self-attention over a sequence (docs/design.md#attention):
// num_heads, key_dim, value_dim (null: key_dim), use_bias, and the call's use_causal_mask (the
// job file's "causal"). The query, key and value projections and the output projection are
// Keras's EinsumDense weights: query.kernel (D, heads, key_dim) and query.bias (heads, key_dim),
// key.* the same, value.* with value_dim, attention_output.kernel (heads, value_dim, D) and its
// bias (D), in Keras's order, glorot_uniform with Keras's fans for kernels of three axes, zero
// biases. Each projection is a dense product over the n x T positions (the kernels' row-major
// layout is the product's); the query, key and value ones are one product, over the three kernels
// copied side by side each step (as nanoGPT's c_attn), whose output the attention reads in place
// (AttentionShape::qkv_row) and whose backward gives dx in one product with no sums after it
// (docs/design.md#attention). The attention between them is Backend::attention_*. dropout drops
// attention probabilities in training as the Dropout layer drops activations (its rule, this
// layer's own stream). Cross-attention (a key or value from another layer), output_shape,
// attention_axes, sliding_window and use_gate are not here.
// Its keys and shape rules: worker/spec/layers/multi_head_attention.h.
#include "worker/spec/layers/multi_head_attention.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "worker/nn/layers/layer_parts.h"
#include "worker/nn/random.h"

namespace dtrain::nn::layers {
namespace {

class MultiHeadAttention : public Layer {
 public:
  MultiHeadAttention(const AttentionKeys& k, Dims in, const LayerContext& c)
      : k_(k),
        index_(c.index),
        t_(in.h),
        d_(in.w),
        hk_(k.heads * k.key_dim),
        hv_(k.heads * k.value()),
        w_(2 * hk_ + hv_),
        rows_(static_cast<size_t>(c.max_batch) * in.h),
        qkv_(c.backend.device(), rows_ * w_),
        o_(c.backend.device(), rows_ * hv_),
        probs_(c.backend.device(), static_cast<size_t>(c.max_batch) * k.heads * in.h * in.h),
        dqkv_(c.backend.device(), rows_ * w_),
        do_(c.backend.device(), rows_ * hv_),
        wqkv_(c.backend.device(), static_cast<size_t>(d_) * w_),
        bqkv_(c.backend.device(), static_cast<size_t>(w_)),
        dwqkv_(c.backend.device(), static_cast<size_t>(d_) * w_),
        dbqkv_(c.backend.device(), static_cast<size_t>(w_)),
        zeros_(c.backend.device(), static_cast<size_t>(std::max({w_, d_}))) {
    c.backend.device().fill_zero(zeros_.data(), zeros_.bytes());
  }

  std::vector<ParamInfo> params() const override {
    const int h = k_.heads, kd = k_.key_dim, vd = k_.value();
    std::vector<ParamInfo> out;
    size_t at = 0;
    auto add = [&](const char* name, std::vector<int64_t> shape) {
      size_t count = 1;
      for (int64_t s : shape) count *= static_cast<size_t>(s);
      out.push_back({name, std::move(shape), at, count});
      at += count;
    };
    add("query.kernel", {d_, h, kd});
    if (k_.use_bias) add("query.bias", {h, kd});
    add("key.kernel", {d_, h, kd});
    if (k_.use_bias) add("key.bias", {h, kd});
    add("value.kernel", {d_, h, vd});
    if (k_.use_bias) add("value.bias", {h, vd});
    add("attention_output.kernel", {h, vd, d_});
    if (k_.use_bias) add("attention_output.bias", {d_});
    return out;
  }

  // Keras's glorot_uniform fans for a kernel of three axes: the first axis is the "receptive
  // field", fan_in its size x the second, fan_out its size x the third.
  void initialize(float* p, float*, uint64_t seed) const override {
    int index = 0;
    for (const ParamInfo& info : params()) {
      if (info.shape.size() == 3) {
        const int field = static_cast<int>(info.shape[0]);
        glorot_uniform(p + info.offset, info.count, field * static_cast<int>(info.shape[1]),
                       field * static_cast<int>(info.shape[2]), random_key(seed, 0xa77e, index));
      } else {
        std::fill(p + info.offset, p + info.offset + info.count, 0.0f);
      }
      ++index;
    }
  }

  void forward(Backend& b, const ForwardArgs& a) override {
    const Weights w = weights_of(a.params);
    const int rows = a.n * t_;
    const float* x = a.x[0];
    side_by_side(b, {w.wq, w.wk, w.wv}, wqkv_.data(), {w.bq, w.bk, w.bv}, bqkv_.data());
    b.dense_forward(rows, d_, w_, x, wqkv_.data(), bqkv_.data(), qkv_.data());
    last_ = shape(a.n);
    if (a.training && k_.dropout > 0) {
      // The Dropout layer's rule (dropout.cc), on this layer's own stream.
      last_.dropout = k_.dropout;
      last_.stream = random_key(a.key.seed, static_cast<uint64_t>(a.key.epoch),
                                static_cast<uint64_t>(a.key.step), 1000 + index_);
    }
    b.attention_forward(last_, q(qkv_), k(qkv_), v(qkv_), probs_.data(), o_.data());
    b.dense_forward(rows, hv_, d_, o_.data(), w.wo, w.bo, a.y);
  }

  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    const Weights w = weights_of(a.params);
    Weights g = weights_of(a.grads);
    const int rows = a.n * t_;
    const float* x = a.x[0];
    {
      const HeldGradient held(b, a.dy, static_cast<size_t>(rows) * d_);
      weight_gradient(b, rows, hv_, d_, o_.data(), a.dy, g.wo, g.bo);
      b.dense_backward_data(rows, hv_, d_, a.dy, w.wo, do_.data());
    }
    b.attention_backward(last_, q(qkv_), k(qkv_), v(qkv_), probs_.data(), do_.data(), q(dqkv_),
                         k(dqkv_), v(dqkv_));
    const HeldGradient held(b, dqkv_.data(), static_cast<size_t>(rows) * w_);
    weight_gradient(b, rows, d_, w_, x, dqkv_.data(), dwqkv_.data(), dbqkv_.data());
    apart(b, dwqkv_.data(), {g.wq, g.wk, g.wv}, dbqkv_.data(), {g.bq, g.bk, g.bv});
    if (enqueued) enqueued(0);
    // dx = [dq dk dv] [Wq Wk Wv]^T, the forward's side-by-side kernels.
    if (a.dx[0]) b.dense_backward_data(rows, d_, w_, dqkv_.data(), wqkv_.data(), a.dx[0]);
  }

 private:
  /// The eight tensors in the flat buffer (biases null without use_bias: zeros_ in forwards).
  struct Weights {
    float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
  };
  Weights weights_of(const float* p) const {
    float* at = const_cast<float*>(p);
    Weights w{};
    auto take = [&](size_t count) {
      float* here = at;
      at += count;
      return here;
    };
    const size_t dk = static_cast<size_t>(d_) * hk_, dv = static_cast<size_t>(d_) * hv_;
    w.wq = take(dk);
    w.bq = k_.use_bias ? take(static_cast<size_t>(hk_)) : nullptr;
    w.wk = take(dk);
    w.bk = k_.use_bias ? take(static_cast<size_t>(hk_)) : nullptr;
    w.wv = take(dv);
    w.bv = k_.use_bias ? take(static_cast<size_t>(hv_)) : nullptr;
    w.wo = take(dv);
    w.bo = k_.use_bias ? take(static_cast<size_t>(d_)) : nullptr;
    if (!k_.use_bias) w.bq = w.bk = w.bv = w.bo = const_cast<float*>(zeros_.data());
    return w;
  }
  /// The query, key and value columns of the side-by-side tensors.
  float* q(Buffer<float>& qkv) const { return qkv.data(); }
  float* k(Buffer<float>& qkv) const { return qkv.data() + hk_; }
  float* v(Buffer<float>& qkv) const { return qkv.data() + 2 * hk_; }
  /// The query, key and value kernels (d_ rows of hk_, hk_, hv_) side by side in kernel (d_ rows
  /// of w_), and their biases in bias (without use_bias, zeros: nothing to copy).
  void side_by_side(Backend& b, std::array<const float*, 3> parts, float* kernel,
                    std::array<const float*, 3> biases, float* bias) const {
    const std::array<int, 3> widths{hk_, hk_, hv_};
    Device& device = b.device();
    for (int r = 0, at = 0; r < d_; ++r)
      for (int p = 0; p < 3; at += widths[p], ++p)
        device.copy(kernel + at, parts[p] + static_cast<size_t>(r) * widths[p],
                    sizeof(float) * widths[p]);
    if (!k_.use_bias) return device.copy(bias, zeros_.data(), sizeof(float) * w_);
    for (int p = 0, at = 0; p < 3; at += widths[p], ++p)
      device.copy(bias + at, biases[p], sizeof(float) * widths[p]);
  }
  /// Its inverse, for the gradients: kernel's columns into the three (biases' with use_bias).
  void apart(Backend& b, const float* kernel, std::array<float*, 3> parts, const float* bias,
             std::array<float*, 3> biases) const {
    const std::array<int, 3> widths{hk_, hk_, hv_};
    Device& device = b.device();
    for (int r = 0, at = 0; r < d_; ++r)
      for (int p = 0; p < 3; at += widths[p], ++p)
        device.copy(parts[p] + static_cast<size_t>(r) * widths[p], kernel + at,
                    sizeof(float) * widths[p]);
    if (!k_.use_bias) return;
    for (int p = 0, at = 0; p < 3; at += widths[p], ++p)
      device.copy(biases[p], bias + at, sizeof(float) * widths[p]);
  }
  void weight_gradient(Backend& b, int rows, int in, int out, const float* x, const float* dy,
                       float* dw, float* db) const {
    if (k_.use_bias) {
      b.dense_backward_weights(rows, in, out, x, dy, dw, db);
    } else {
      b.dense_backward_weight_rows(rows, in, out, x, dy, dw, 0, in);
    }
  }
  AttentionShape shape(int n) const {
    AttentionShape s;
    s.n = n, s.t = t_, s.heads = k_.heads, s.key_dim = k_.key_dim, s.value_dim = k_.value();
    s.causal = k_.causal;
    s.scale = 1.0f / std::sqrt(static_cast<float>(k_.key_dim));
    s.qkv_row = w_;
    return s;
  }

  AttentionKeys k_;
  int index_;
  AttentionShape last_;  ///< the last forward's, dropout's stream included, for its backward
  int t_, d_, hk_, hv_;
  int w_;  ///< the side-by-side projection's width: hk_ + hk_ + hv_
  size_t rows_;
  // The last forward's projections side by side, probabilities and attention output (for
  // backward), backward's own scratch, and the side-by-side kernel and bias, their gradients.
  Buffer<float> qkv_, o_, probs_, dqkv_, do_, wqkv_, bqkv_, dwqkv_, dbqkv_, zeros_;
};

}  // namespace

std::unique_ptr<Layer> make_multi_head_attention(const LayerConfig& config,
                                                 const std::vector<Dims>& in,
                                                 const LayerContext& c) {
  const AttentionKeys& k = static_cast<const MultiHeadAttentionConfig&>(config).keys();
  return std::make_unique<MultiHeadAttention>(k, in[0], c);
}

}  // namespace dtrain::nn::layers
