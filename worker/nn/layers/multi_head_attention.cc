// Keras's MultiHeadAttention as self-attention over a sequence (docs/design.md#attention):
// num_heads, key_dim, value_dim (null: key_dim), use_bias, and the call's use_causal_mask (the
// job file's "causal"). The query, key and value projections and the output projection are
// Keras's EinsumDense weights: query.kernel (D, heads, key_dim) and query.bias (heads, key_dim),
// key.* the same, value.* with value_dim, attention_output.kernel (heads, value_dim, D) and its
// bias (D), in Keras's order, glorot_uniform with Keras's fans for kernels of three axes, zero
// biases. Each projection is a dense product over the n x T positions (the kernels' row-major
// layout is the product's); the attention between them is Backend::attention_*. dropout drops
// attention probabilities in training as the Dropout layer drops activations (its rule, this
// layer's own stream). Cross-attention (a key or value from another layer), output_shape,
// attention_axes, sliding_window and use_gate are not here.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "worker/nn/layers/layer_keys.h"
#include "worker/nn/random.h"

namespace dtrain::nn::layers {
namespace {

struct AttentionKeys {
  int heads = 0, key_dim = 0, value_dim = 0;  ///< value_dim 0: key_dim
  bool use_bias = true, causal = false;
  float dropout = 0;
  int value() const { return value_dim > 0 ? value_dim : key_dim; }
};

class MultiHeadAttention : public Layer {
 public:
  MultiHeadAttention(const AttentionKeys& k, Dims in, const LayerContext& c)
      : k_(k),
        index_(c.index),
        t_(in.h),
        d_(in.w),
        hk_(k.heads * k.key_dim),
        hv_(k.heads * k.value()),
        rows_(static_cast<size_t>(c.max_batch) * in.h),
        q_(c.backend.device(), rows_ * hk_),
        k_buf_(c.backend.device(), rows_ * hk_),
        v_(c.backend.device(), rows_ * hv_),
        o_(c.backend.device(), rows_ * hv_),
        probs_(c.backend.device(), static_cast<size_t>(c.max_batch) * k.heads * in.h * in.h),
        dq_(c.backend.device(), rows_ * hk_),
        dk_(c.backend.device(), rows_ * hk_),
        dv_(c.backend.device(), rows_ * hv_),
        do_(c.backend.device(), rows_ * hv_),
        dx_part_(c.backend.device(), rows_ * d_),
        zeros_(c.backend.device(), static_cast<size_t>(std::max({hk_, hv_, d_}))) {
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
    b.dense_forward(rows, d_, hk_, x, w.wq, w.bq, q_.data());
    b.dense_forward(rows, d_, hk_, x, w.wk, w.bk, k_buf_.data());
    b.dense_forward(rows, d_, hv_, x, w.wv, w.bv, v_.data());
    last_ = shape(a.n);
    if (a.training && k_.dropout > 0) {
      // The Dropout layer's rule (dropout.cc), on this layer's own stream.
      last_.dropout = k_.dropout;
      last_.stream = random_key(a.key.seed, static_cast<uint64_t>(a.key.epoch),
                                static_cast<uint64_t>(a.key.step), 1000 + index_);
    }
    b.attention_forward(last_, q_.data(), k_buf_.data(), v_.data(), probs_.data(), o_.data());
    b.dense_forward(rows, hv_, d_, o_.data(), w.wo, w.bo, a.y);
  }

  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    const Weights w = weights_of(a.params);
    Weights g = weights_of(a.grads);
    const int rows = a.n * t_;
    const float* x = a.x[0];
    weight_gradient(b, rows, hv_, d_, o_.data(), a.dy, g.wo, g.bo);
    b.dense_backward_data(rows, hv_, d_, a.dy, w.wo, do_.data());
    b.attention_backward(last_, q_.data(), k_buf_.data(), v_.data(), probs_.data(), do_.data(),
                         dq_.data(), dk_.data(), dv_.data());
    weight_gradient(b, rows, d_, hk_, x, dq_.data(), g.wq, g.bq);
    weight_gradient(b, rows, d_, hk_, x, dk_.data(), g.wk, g.bk);
    weight_gradient(b, rows, d_, hv_, x, dv_.data(), g.wv, g.bv);
    if (enqueued) enqueued(0);
    if (!a.dx[0]) return;
    // dx = dq Wq^T + dk Wk^T + dv Wv^T, added in that order.
    b.dense_backward_data(rows, d_, hk_, dq_.data(), w.wq, a.dx[0]);
    b.dense_backward_data(rows, d_, hk_, dk_.data(), w.wk, dx_part_.data());
    b.add(static_cast<size_t>(rows) * d_, dx_part_.data(), a.dx[0]);
    b.dense_backward_data(rows, d_, hv_, dv_.data(), w.wv, dx_part_.data());
    b.add(static_cast<size_t>(rows) * d_, dx_part_.data(), a.dx[0]);
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
    return s;
  }

  AttentionKeys k_;
  int index_;
  AttentionShape last_;  ///< the last forward's, dropout's stream included, for its backward
  int t_, d_, hk_, hv_;
  size_t rows_;
  // The last forward's projections, probabilities and attention output (for backward), and
  // backward's own scratch.
  Buffer<float> q_, k_buf_, v_, o_, probs_, dq_, dk_, dv_, do_, dx_part_, zeros_;
};

class MultiHeadAttentionConfig : public LayerConfig {
 public:
  explicit MultiHeadAttentionConfig(const AttentionKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    const Dims& x = in[0];
    if (!x.sequence || x.c != 1) {
      throw common::ConfigError(fmt::format(
          "{}: multi_head_attention takes a sequence (positions x features), not a {}x{}x{} "
          "input",
          where, x.h, x.w, x.c));
    }
    return x;
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<MultiHeadAttention>(k_, in[0], c);
  }
  bool gpu_tested() const override { return false; }
  bool draws_randomness() const override { return k_.dropout > 0; }
  LayerCost cost(const std::vector<Dims>& in) const override {
    const double t = in[0].h, d = in[0].w, hk = k_.heads * k_.key_dim, hv = k_.heads * k_.value();
    LayerCost c;
    // The four projections, then the scores and the weighted sum (all keys, mask or not).
    c.macs = t * d * (2 * hk + 2 * hv) + t * t * (hk + hv);
    const int rows = in[0].h, di = in[0].w, ik = static_cast<int>(hk), iv = static_cast<int>(hv);
    c.more_matmuls = {{di, ik, rows}, {di, ik, rows}, {di, iv, rows}, {iv, di, rows}};
    c.attention.t = in[0].h, c.attention.heads = k_.heads, c.attention.key_dim = k_.key_dim;
    c.attention.value_dim = k_.value(), c.attention.causal = k_.causal;
    return c;
  }

 private:
  AttentionKeys k_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_multi_head_attention(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "num_heads", "key_dim", "value_dim", "use_bias",
                   "causal", "use_causal_mask", "dropout", "kernel_initializer",
                   "bias_initializer"});
  AttentionKeys k;
  k.heads = static_cast<int>(node.at("num_heads").as_int(1, 4096));
  k.key_dim = static_cast<int>(node.at("key_dim").as_int(1, 1 << 16));
  if (auto n = node.find("value_dim"); n && !n->is_null())
    k.value_dim = static_cast<int>(n->as_int(1, 1 << 16));
  if (auto n = node.find("use_bias")) k.use_bias = n->as_bool();
  // The job file's "causal"; a Keras node's call argument use_causal_mask arrives as that key.
  for (const char* key : {"causal", "use_causal_mask"})
    if (auto n = node.find(key)) k.causal = n->as_bool();
  if (auto n = node.find("dropout")) {
    k.dropout = static_cast<float>(n->as_number(0, 1));
    if (k.dropout >= 1) n->fail("expected a rate in [0, 1)");
  }
  if (auto n = node.find("kernel_initializer"))
    if (parse_initializer(*n) != Initializer::kGlorotUniform)
      n->fail("multi_head_attention's kernels are glorot_uniform (Keras's default)");
  if (auto n = node.find("bias_initializer"); n && (!n->is_string() || n->as_string() != "zeros"))
    n->fail("multi_head_attention's biases are zeros (Keras's default)");
  return std::make_unique<MultiHeadAttentionConfig>(k);
}

// Keras's MultiHeadAttention.get_config() (keras/src/layers/attention/multi_head_attention.py).
std::vector<KerasKeySpec> keras_keys_multi_head_attention() {
  return {{"num_heads", KerasKey::kRead},         {"key_dim", KerasKey::kRead},
          {"value_dim", KerasKey::kRead},         {"dropout", KerasKey::kRead},
          {"use_bias", KerasKey::kRead},          {"use_gate", KerasKey::kFalse},
          {"output_shape", KerasKey::kNull},      {"attention_axes", KerasKey::kSequenceAxis},
          {"sliding_window", KerasKey::kNull},    {"kernel_initializer", KerasKey::kGlorotUniform},
          {"bias_initializer", KerasKey::kZeros}, {"kernel_regularizer", KerasKey::kNull},
          {"bias_regularizer", KerasKey::kNull},  {"kernel_constraint", KerasKey::kNull},
          {"bias_constraint", KerasKey::kNull},   {"seed", KerasKey::kSeed}};
}

// MultiHeadAttention.call(query, value, key=None, query_mask=None, value_mask=None,
// key_mask=None, attention_mask=None, return_attention_scores=False, training=None,
// use_causal_mask=False), after its query: self-attention only (value and key the query's
// tensor), no masks but the causal one, which the parse reads as use_causal_mask.
std::vector<KerasArgSpec> keras_call_multi_head_attention() {
  return {{"value", KerasArg::kSameTensor},
          {"key", KerasArg::kSameTensor},
          {"query_mask", KerasArg::kNull},
          {"value_mask", KerasArg::kNull},
          {"key_mask", KerasArg::kNull},
          {"attention_mask", KerasArg::kNull},
          {"return_attention_scores", KerasArg::kFalse},
          {"training", KerasArg::kNull},
          {"use_causal_mask", KerasArg::kFlag}};
}

}  // namespace dtrain::nn::layers
