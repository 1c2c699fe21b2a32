// The CPU backend on oneDNN: convolution (forward, backward data, backward weights), max pooling
// and ReLU as oneDNN primitives made once per shape and cached; dense layers on oneDNN's sgemm;
// log-softmax as a primitive with the loss around it; optimizer updates as plain vectorisable
// loops. Plain layouts (nchw, oihw) everywhere: oneDNN picks its jit gemm convolution for them.
// The only file that includes oneDNN.
#include <cmath>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/host_backend.h"

namespace dtrain::nn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

memory::desc plain(const memory::dims& dims, Tag tag) {
  return memory::desc(dims, Dt::f32, tag);
}

// Cache key from a trivially copyable shape struct.
template <class Shape>
std::string key_of(const Shape& s) {
  return std::string(reinterpret_cast<const char*>(&s), sizeof s);
}

struct ConvPrimitives {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  memory::desc src, weights, bias, dst;
};

struct PoolPrimitives {
  dnnl::pooling_forward forward;
  dnnl::pooling_backward backward;
  memory::desc src, dst, workspace;
};

struct ReluPrimitives {
  dnnl::eltwise_forward forward;
  dnnl::eltwise_backward backward;
  memory::desc data;
};

struct LogSoftmaxPrimitives {
  dnnl::logsoftmax_forward forward;
  memory::desc data;
};

class DnnlBackend : public HostBackend {
 public:
  DnnlBackend() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}
  std::string name() const override { return "cpu (oneDNN)"; }

  void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                      float* y) override {
    ConvPrimitives& p = conv(s);
    p.forward.execute(stream_, {{DNNL_ARG_SRC, mem(p.src, x)},
                                {DNNL_ARG_WEIGHTS, mem(p.weights, w)},
                                {DNNL_ARG_BIAS, mem(p.bias, b)},
                                {DNNL_ARG_DST, mem(p.dst, y)}});
    stream_.wait();
  }

  void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                            float* dx) override {
    ConvPrimitives& p = conv(s);
    p.backward_data.execute(stream_, {{DNNL_ARG_DIFF_DST, mem(p.dst, dy)},
                                      {DNNL_ARG_WEIGHTS, mem(p.weights, w)},
                                      {DNNL_ARG_DIFF_SRC, mem(p.src, dx)}});
    stream_.wait();
  }

  void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                               float* db) override {
    ConvPrimitives& p = conv(s);
    p.backward_weights.execute(stream_, {{DNNL_ARG_SRC, mem(p.src, x)},
                                         {DNNL_ARG_DIFF_DST, mem(p.dst, dy)},
                                         {DNNL_ARG_DIFF_WEIGHTS, mem(p.weights, dw)},
                                         {DNNL_ARG_DIFF_BIAS, mem(p.bias, db)}});
    stream_.wait();
  }

  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override {
    for (int i = 0; i < n; ++i)
      std::memcpy(y + static_cast<size_t>(i) * out, b, sizeof(float) * out);
    gemm('N', 'N', n, out, in, x, in, w, out, 1.0f, y, out);
  }

  void dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                           float* dx) override {
    gemm('N', 'T', n, in, out, dy, out, w, out, 0.0f, dx, in);
  }

  void dense_backward_weights(int n, int in, int out, const float* x, const float* dy, float* dw,
                              float* db) override {
    dense_backward_weight_rows(n, in, out, x, dy, dw, 0, in);
    dense_backward_bias(n, out, dy, db);
  }

  void dense_backward_weight_rows(int n, int in, int out, const float* x, const float* dy,
                                  float* dw, int row_begin, int row_end) override {
    DT_ENFORCE(0 <= row_begin && row_begin <= row_end && row_end <= in, "rows {}..{} of {}",
               row_begin, row_end, in);
    if (row_begin == row_end) return;
    gemm('T', 'N', row_end - row_begin, out, n, x + row_begin, in, dy, out, 0.0f,
         dw + static_cast<size_t>(row_begin) * out, out);
  }

  void dense_backward_bias(int n, int out, const float* dy, float* db) override {
    std::fill(db, db + out, 0.0f);
    for (int i = 0; i < n; ++i) {
      const float* row = dy + static_cast<size_t>(i) * out;
      for (int j = 0; j < out; ++j) db[j] += row[j];
    }
  }

  void relu_forward(size_t count, const float* x, float* y) override {
    ReluPrimitives& p = relu(count);
    p.forward.execute(stream_, {{DNNL_ARG_SRC, mem(p.data, x)}, {DNNL_ARG_DST, mem(p.data, y)}});
    stream_.wait();
  }

  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override {
    ReluPrimitives& p = relu(count);
    p.backward.execute(stream_, {{DNNL_ARG_DST, mem(p.data, y)},
                                 {DNNL_ARG_DIFF_DST, mem(p.data, dy)},
                                 {DNNL_ARG_DIFF_SRC, mem(p.data, dx)}});
    stream_.wait();
  }

  size_t maxpool_workspace_bytes(const PoolShape& s) override {
    return pool(s).workspace.get_size();
  }

  void maxpool_forward(const PoolShape& s, const float* x, float* y, void* workspace) override {
    PoolPrimitives& p = pool(s);
    p.forward.execute(stream_, {{DNNL_ARG_SRC, mem(p.src, x)},
                                {DNNL_ARG_DST, mem(p.dst, y)},
                                {DNNL_ARG_WORKSPACE, memory(p.workspace, engine_, workspace)}});
    stream_.wait();
  }

  void maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                        float* dx) override {
    PoolPrimitives& p = pool(s);
    p.backward.execute(
        stream_, {{DNNL_ARG_DIFF_DST, mem(p.dst, dy)},
                  {DNNL_ARG_WORKSPACE, memory(p.workspace, engine_, const_cast<void*>(workspace))},
                  {DNNL_ARG_DIFF_SRC, mem(p.src, dx)}});
    stream_.wait();
  }

  void softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                             float* dlogits, float* totals) override;

  void sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                  float* velocity) override;
  void adam_update(const AdamParams& p, int64_t step, size_t count, float* w, const float* g,
                   float* m, float* v) override;
  void rmsprop_update(const RmspropParams& p, size_t count, float* w, const float* g,
                      float* velocity, float* momentum_slot, float* average_gradient) override;
  void adamw_update(const AdamWParams& p, int64_t step, size_t count, float* w, const float* g,
                    float* m, float* v) override;

 private:
  memory mem(const memory::desc& md, const void* data) {
    return memory(md, engine_, const_cast<void*>(data));
  }

  // Row-major C = A op B (+ beta C) with oneDNN's sgemm.
  static void gemm(char ta, char tb, int m, int n, int k, const float* a, int lda, const float* b,
                   int ldb, float beta, float* c, int ldc) {
    dnnl_status_t rc = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    DT_ENFORCE(rc == dnnl_success, "dnnl_sgemm failed with status {}", static_cast<int>(rc));
  }

  ConvPrimitives& conv(const ConvShape& s);
  PoolPrimitives& pool(const PoolShape& s);
  ReluPrimitives& relu(size_t count);
  LogSoftmaxPrimitives& log_softmax(int n, int classes);

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<std::string, std::unique_ptr<ConvPrimitives>> convs_;
  std::map<std::string, std::unique_ptr<PoolPrimitives>> pools_;
  std::map<size_t, std::unique_ptr<ReluPrimitives>> relus_;
  std::map<std::pair<int, int>, std::unique_ptr<LogSoftmaxPrimitives>> log_softmaxes_;
  std::vector<float> log_probabilities_;
};

ConvPrimitives& DnnlBackend::conv(const ConvShape& s) {
  auto& slot = convs_[key_of(s)];
  if (slot) return *slot;
  auto p = std::make_unique<ConvPrimitives>();
  p->src = plain({s.n, s.c, s.h, s.w}, Tag::nchw);
  p->weights = plain({s.k, s.c, s.kh, s.kw}, Tag::oihw);
  p->bias = plain({s.k}, Tag::x);
  p->dst = plain({s.n, s.k, s.oh(), s.ow()}, Tag::nchw);
  memory::dims strides = {s.sh, s.sw}, pad_l = {s.pad_top, s.pad_left},
               pad_r = {s.pad_bottom, s.pad_right};
  auto algorithm = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc fwd(
      {dnnl::prop_kind::forward_training, algorithm, p->src, p->weights, p->bias, p->dst, strides,
       pad_l, pad_r},
      engine_);
  dnnl::convolution_backward_data::primitive_desc bwd_data(
      {algorithm, p->src, p->weights, p->dst, strides, pad_l, pad_r}, engine_, fwd);
  dnnl::convolution_backward_weights::primitive_desc bwd_weights(
      {algorithm, p->src, p->weights, p->bias, p->dst, strides, pad_l, pad_r}, engine_, fwd);
  p->forward = dnnl::convolution_forward(fwd);
  p->backward_data = dnnl::convolution_backward_data(bwd_data);
  p->backward_weights = dnnl::convolution_backward_weights(bwd_weights);
  slot = std::move(p);
  return *slot;
}

PoolPrimitives& DnnlBackend::pool(const PoolShape& s) {
  auto& slot = pools_[key_of(s)];
  if (slot) return *slot;
  auto p = std::make_unique<PoolPrimitives>();
  p->src = plain({s.n, s.c, s.h, s.w}, Tag::nchw);
  p->dst = plain({s.n, s.c, s.oh(), s.ow()}, Tag::nchw);
  memory::dims strides = {s.sh, s.sw}, kernel = {s.kh, s.kw}, pad = {0, 0};
  auto algorithm = dnnl::algorithm::pooling_max;
  dnnl::pooling_forward::primitive_desc fwd(
      {dnnl::prop_kind::forward_training, algorithm, p->src, p->dst, strides, kernel, pad, pad},
      engine_);
  dnnl::pooling_backward::primitive_desc bwd({algorithm, p->src, p->dst, strides, kernel, pad, pad},
                                             engine_, fwd);
  p->workspace = fwd.workspace_desc();
  p->forward = dnnl::pooling_forward(fwd);
  p->backward = dnnl::pooling_backward(bwd);
  slot = std::move(p);
  return *slot;
}

ReluPrimitives& DnnlBackend::relu(size_t count) {
  auto& slot = relus_[count];
  if (slot) return *slot;
  auto p = std::make_unique<ReluPrimitives>();
  p->data = plain({static_cast<memory::dim>(count)}, Tag::x);
  dnnl::eltwise_forward::primitive_desc fwd(
      {dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu, p->data, 0.0f, 0.0f},
      engine_);
  dnnl::eltwise_backward::primitive_desc bwd(
      {dnnl::algorithm::eltwise_relu_use_dst_for_bwd, p->data, p->data, 0.0f, 0.0f}, engine_, fwd);
  p->forward = dnnl::eltwise_forward(fwd);
  p->backward = dnnl::eltwise_backward(bwd);
  slot = std::move(p);
  return *slot;
}

LogSoftmaxPrimitives& DnnlBackend::log_softmax(int n, int classes) {
  auto& slot = log_softmaxes_[{n, classes}];
  if (slot) return *slot;
  auto p = std::make_unique<LogSoftmaxPrimitives>();
  p->data = plain({n, classes}, Tag::nc);
  dnnl::logsoftmax_forward::primitive_desc fwd({dnnl::prop_kind::forward_training, p->data, 1},
                                               engine_);
  p->forward = dnnl::logsoftmax_forward(fwd);
  slot = std::move(p);
  return *slot;
}

void DnnlBackend::softmax_cross_entropy(int n, int classes, const float* logits,
                                        const int32_t* labels, float* dlogits, float* totals) {
  LogSoftmaxPrimitives& p = log_softmax(n, classes);
  log_probabilities_.resize(static_cast<size_t>(n) * classes);
  p.forward.execute(stream_, {{DNNL_ARG_SRC, mem(p.data, logits)},
                              {DNNL_ARG_DST, mem(p.data, log_probabilities_.data())}});
  stream_.wait();
  double loss = 0;
  int hits = 0;
  float scale = 1.0f / static_cast<float>(n);
  for (int i = 0; i < n; ++i) {
    const float* lp = log_probabilities_.data() + static_cast<size_t>(i) * classes;
    const float* row = logits + static_cast<size_t>(i) * classes;
    int label = labels[i];
    DT_ENFORCE(label >= 0 && label < classes, "label {} outside 0..{}", label, classes - 1);
    int best = 0;
    for (int j = 1; j < classes; ++j)
      if (row[j] > row[best]) best = j;
    if (dlogits) {
      float* d = dlogits + static_cast<size_t>(i) * classes;
      for (int j = 0; j < classes; ++j) d[j] = std::exp(lp[j]) * scale;
      d[label] -= scale;
    }
    loss -= lp[label];
    hits += best == label ? 1 : 0;
  }
  totals[0] = static_cast<float>(totals[0] + loss);
  totals[1] += static_cast<float>(hits);
  totals[2] += static_cast<float>(n);
}

void DnnlBackend::sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                             float* velocity) {
  const float lr = p.learning_rate, mu = p.momentum;
  if (mu == 0.0f) {
    for (size_t i = 0; i < count; ++i) w[i] -= lr * g[i];
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    velocity[i] = mu * velocity[i] - lr * g[i];
    w[i] += p.nesterov ? mu * velocity[i] - lr * g[i] : velocity[i];
  }
}

void DnnlBackend::adam_update(const AdamParams& p, int64_t step, size_t count, float* w,
                              const float* g, float* m, float* v) {
  DT_ENFORCE(step >= 1, "Adam step {} (counts from 1)", step);
  const double t = static_cast<double>(step);
  const float lr = static_cast<float>(p.learning_rate * std::sqrt(1.0 - std::pow(p.beta_2, t)) /
                                      (1.0 - std::pow(p.beta_1, t)));
  const float b1 = p.beta_1, b2 = p.beta_2, eps = p.epsilon;
  for (size_t i = 0; i < count; ++i) {
    m[i] += (g[i] - m[i]) * (1.0f - b1);
    v[i] += (g[i] * g[i] - v[i]) * (1.0f - b2);
    w[i] -= lr * m[i] / (std::sqrt(v[i]) + eps);
  }
}

void DnnlBackend::rmsprop_update(const RmspropParams& p, size_t count, float* w, const float* g,
                                 float* velocity, float* momentum_slot, float* average_gradient) {
  const float lr = p.learning_rate, rho = p.rho, mu = p.momentum, eps = p.epsilon;
  for (size_t i = 0; i < count; ++i) {
    velocity[i] = rho * velocity[i] + (1.0f - rho) * g[i] * g[i];
    float denominator = velocity[i] + eps;
    if (p.centered) {
      average_gradient[i] = rho * average_gradient[i] + (1.0f - rho) * g[i];
      denominator = velocity[i] - average_gradient[i] * average_gradient[i] + eps;
    }
    float increment = lr * g[i] / std::sqrt(denominator);
    if (mu > 0.0f) {
      momentum_slot[i] = mu * momentum_slot[i] + increment;
      w[i] -= momentum_slot[i];
    } else {
      w[i] -= increment;
    }
  }
}

void DnnlBackend::adamw_update(const AdamWParams& p, int64_t step, size_t count, float* w,
                               const float* g, float* m, float* v) {
  const float decay = p.weight_decay, lr = p.learning_rate;
  for (size_t i = 0; i < count; ++i) w[i] -= w[i] * decay * lr;
  adam_update({p.learning_rate, p.beta_1, p.beta_2, p.epsilon}, step, count, w, g, m, v);
}

}  // namespace

std::unique_ptr<Backend> make_dnnl_backend(MathMode mode) {
  if (mode == MathMode::kTf32) mode = MathMode::kFloat32;
  if (!cpu_supports(mode))
    throw common::ConfigError(fmt::format("this CPU ({}) cannot compute in {}", cpu_isa_name(),
                                          math_mode_name(mode)));
  return std::make_unique<DnnlBackend>();
}

bool cpu_supports(MathMode mode) {
  return mode == MathMode::kFloat32 || mode == MathMode::kTf32;
}

std::string cpu_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::sse41: return "sse41";
    default: return "other";
  }
}

}  // namespace dtrain::nn
