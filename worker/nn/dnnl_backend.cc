// The CPU backend on oneDNN: convolutions in the layouts oneDNN prefers (dnnl_parts.h stages
// them from and to the layers' buffers, which the model keeps in blocks of 16 channels where
// it can on an AVX-512 CPU: docs/design.md#blocked-activations), except those with few input
// channels, which run direct_conv.h's loops on the NCHW buffers (all but their input gradient);
// dense layers on sgemm and matmul primitives; max pooling and ReLU as primitives, all made once
// per shape and cached (average pooling and the other activations too); log-softmax as a primitive
// with the loss around it; optimizer updates as plain loops split over OpenMP's threads. In
// mixed_bfloat16 the products take bf16 copies of their inputs (docs/design.md#mixed-precision);
// everything else stays float32. The dnnl_* files are the only ones that include oneDNN.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "worker/nn/bf16_rounding.h"
#include "worker/nn/direct_conv.h"
#include "worker/nn/dnnl_parts.h"
#include "worker/nn/host_attention.h"
#include "worker/nn/host_backend.h"
#include "worker/nn/host_eltwise.h"
#include "worker/nn/host_norm.h"
#include "worker/nn/host_sequence.h"
#include "worker/nn/streamed_update.h"

namespace dtrain::nn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using dnnl_parts::Conv;
using dnnl_parts::Matmul;
using dnnl_parts::MatmulShape;
using dnnl_parts::Rounder;

memory::desc plain(const memory::dims& dims, Tag tag) {
  return memory::desc(dims, Dt::f32, tag);
}

// Cache key from a trivially copyable shape struct.
template <class Shape>
std::string key_of(const Shape& s) {
  return std::string(reinterpret_cast<const char*>(&s), sizeof s);
}

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

class DnnlBackend : public HostBackend {
 public:
  DnnlBackend(MathMode mode, bool blocked_channels)
      : mode_(mode),
        engine_(dnnl::engine::kind::cpu, 0),
        stream_(engine_),
        rounder_(engine_),
        // oneDNN's AVX-512 kernels block channels by 16; its AVX2 ones by 8, which these
        // activations would be reordered to at every call.
        blocked_channels_(blocked_channels && own_kernels_may_use(VectorIsa::kAvx512)) {}
  std::string name() const override {
    return bf16() ? fmt::format("cpu (oneDNN, mixed_bfloat16 on {})", cpu_isa_name())
                  : std::string("cpu (oneDNN)");
  }
  MathMode math_mode() const override { return mode_; }
  std::string implementations() const override;
  bool blocks_channels() const override { return blocked_channels_; }
  void reorder_channels(int n, int c, int hw, Layout to, const float* x, float* y) override;
  // Batch normalization writes the copies in its passes (host_norm.h) with AVX512_BF16's
  // rounding, the bits of the convolutions' own (docs/design.md#rounded-copies).
  bool makes_rounded_copies() const override {
    return bf16() && blocked_channels_ && bf16_rounding::vectorized();
  }

  // A convolution with few input channels runs direct_conv.h's loops on the NCHW buffers, except
  // for its input gradient; others run oneDNN's primitives in blocked layouts.
  void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                      float* y) override {
    conv_forward(s, x, w, b, y, false);
  }
  void conv2d_relu_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                           float* y) override {
    conv_forward(s, x, w, b, y, true);
  }
  void conv2d_forward_rounded(const ConvShape& s, const float* x, const uint16_t* x16,
                              const float* w, const float* b, float* y) override {
    if (direct(s)) return conv_forward(s, x, w, b, y, false);
    conv(s).forward(stream_, x, w, b, y, false, x16);
  }
  void conv2d_backward_rounded(const ConvShape& s, const float* x, const float* dy,
                               const uint16_t* dy16, const float* w, float* dx, float* dw,
                               float* db, const std::function<void()>& weights_done) override {
    if (direct(s)) return HostBackend::conv2d_backward(s, x, dy, w, dx, dw, db, weights_done);
    conv(s).backward(stream_, x, dy, w, dx, dw, db, weights_done, dy16);
  }
  bool conv2d_backward_reads_rounded_only(const ConvShape& s) override {
    return makes_rounded_copies() && !direct_suits(s) && conv(s).reads_rounded_dy_only();
  }
  bool conv2d_forward_reads_rounded_only(const ConvShape& s) override {
    return makes_rounded_copies() && !direct_suits(s) && conv(s).reads_rounded_x_only();
  }
  void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                            float* dx) override {
    conv(s).backward_data(stream_, dy, w, dx);
  }
  void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                               float* db) override {
    if (direct(s)) {
      return direct_conv::backward_weights(s, x, nullptr, plain_output(s, dy, 0), dw, db, bf16());
    }
    conv(s).backward_weights(stream_, x, dy, dw, db);
  }
  void conv2d_backward(const ConvShape& s, const float* x, const float* dy, const float* w,
                       float* dx, float* dw, float* db,
                       const std::function<void()>& weights_done) override {
    if (direct(s)) return HostBackend::conv2d_backward(s, x, dy, w, dx, dw, db, weights_done);
    conv(s).backward(stream_, x, dy, w, dx, dw, db, weights_done);
  }
  void conv2d_relu_backward_weights(const ConvShape& s, const float* x, const float* y,
                                    const float* dy, float* dw, float* db,
                                    float* scratch) override {
    if (direct(s)) {
      return direct_conv::backward_weights(s, x, plain_output(s, y, 0), plain_output(s, dy, 1), dw,
                                           db, bf16());
    }
    HostBackend::conv2d_relu_backward_weights(s, x, y, dy, dw, db, scratch);
  }

  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override {
    dense(n, in, out, x, w, b, y, false);
  }
  void dense_relu_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                          float* y) override {
    dense(n, in, out, x, w, b, y, true);
  }

  void dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                           float* dx) override {
    // dx (n x in) = dy (n x out) w^T, w^T a view of w (in x out).
    MatmulShape shape{n, in, out, out, 1, 1, out, in, false, false, bf16()};
    if (!bf16()) return matmul(shape).run(stream_, dy, w, nullptr, dx);
    const uint16_t* dy16 = rounded_gradient(dy, static_cast<size_t>(n) * out);
    const uint16_t* w16 = rounder_.reuse(w, static_cast<size_t>(in) * out, stream_);
    matmul(shape).run(stream_, dy16, w16, nullptr, dx);
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
    // dw rows (rows x out) = x^T rows (a view of x's columns) dy (n x out).
    float* rows = dw + static_cast<size_t>(row_begin) * out;
    if (!bf16())
      return gemm('T', 'N', row_end - row_begin, out, n, x + row_begin, in, dy, out, 0.0f, rows,
                  out);
    MatmulShape shape{row_end - row_begin, out, n, 1, in, out, 1, out, false, false, true};
    const uint16_t* x16 = rounder_.reuse(x, static_cast<size_t>(n) * in, stream_);
    const uint16_t* dy16 = rounded_gradient(dy, static_cast<size_t>(n) * out);
    matmul(shape).run(stream_, x16 + row_begin, dy16, nullptr, rows);
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

  void batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                  const float* gamma, const float* beta, float* y, float* mean,
                                  float* var) override {
    if (s.layout != Layout::kBlocked || !s.relu)
      return host_batchnorm_forward_training(s, epsilon, x, gamma, beta, y, mean, var);
    const size_t c = static_cast<size_t>(s.c);
    NormFactors& f = norm_factors_[mean];
    f.scale.resize(c);
    f.shift.resize(c);
    host_batchnorm_forward_training(s, epsilon, x, gamma, beta, y, mean, var,
                                    direct_conv::Vectors::kWidest, f.scale.data(), f.shift.data());
    f.mean.assign(mean, mean + c);
    f.var.assign(var, var + c);
    if (gamma)
      f.gamma.assign(gamma, gamma + c);
    else
      f.gamma.clear();
  }
  void batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                   const float* gamma, const float* beta, const float* mean,
                                   const float* var, float* y) override {
    host_batchnorm_forward_inference(s, epsilon, x, gamma, beta, mean, var, y);
  }
  // In blocks of channels, the add (and its ReLU) in the normalization's output pass.
  void batchnorm_add_forward_training(const NormShape& s, float epsilon, const float* x,
                                      const float* gamma, const float* beta, const float* addend,
                                      bool relu, float* y, float* mean, float* var) override {
    if (s.layout != Layout::kBlocked || s.relu) {
      NormShape unrounded = s;  // the copy is of the sum
      unrounded.rounded = nullptr;
      HostBackend::batchnorm_add_forward_training(unrounded, epsilon, x, gamma, beta, addend, relu,
                                                  y, mean, var);
      if (s.rounded) bf16_rounding::round_any(y, s.count(), s.rounded);
      return;
    }
    host_batchnorm_forward_training(s, epsilon, x, gamma, beta, y, mean, var,
                                    direct_conv::Vectors::kWidest, nullptr, nullptr,
                                    {addend, relu});
  }
  void batchnorm_add_forward_inference(const NormShape& s, float epsilon, const float* x,
                                       const float* gamma, const float* beta, const float* mean,
                                       const float* var, const float* addend, bool relu,
                                       float* y) override {
    if (s.layout != Layout::kBlocked || s.relu) {
      NormShape unrounded = s;
      unrounded.rounded = nullptr;
      HostBackend::batchnorm_add_forward_inference(unrounded, epsilon, x, gamma, beta, mean, var,
                                                   addend, relu, y);
      if (s.rounded) bf16_rounding::round_any(y, s.count(), s.rounded);
      return;
    }
    host_batchnorm_forward_inference(s, epsilon, x, gamma, beta, mean, var, y,
                                     direct_conv::Vectors::kWidest, {addend, relu});
  }
  void batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                          const float* dy, const float* gamma, const float* mean, const float* var,
                          float* dx, float* dgamma, float* dbeta) override {
    const NormFactors* f = factors_of(s, gamma, mean, var);
    host_batchnorm_backward(s, epsilon, x, y, dy, gamma, mean, var, dx, dgamma, dbeta,
                            direct_conv::Vectors::kWidest, f ? f->scale.data() : nullptr,
                            f ? f->shift.data() : nullptr);
  }
  void batchnorm_sums(const NormShape& s, const float* x, const float* center,
                      float* sums) override {
    host_batchnorm_sums(s, x, center, sums);
  }
  void batchnorm_backward_data(const NormShape& s, float epsilon, const float* x, const float* y,
                               const float* dy, const float* gamma, const float* mean,
                               const float* var, const float* totals, double count,
                               float* dx) override {
    host_batchnorm_backward_data(s, epsilon, x, y, dy, gamma, mean, var, totals, count, dx);
  }
  void embedding_forward(int rows, int input_dim, int output_dim, const float* ids,
                         const float* table, float* y) override {
    host_embedding_forward(rows, input_dim, output_dim, ids, table, y);
  }
  void embedding_backward(int rows, int input_dim, int output_dim, const float* ids,
                          const float* dy, float* dtable) override {
    host_embedding_backward(rows, input_dim, output_dim, ids, dy, dtable);
  }
  void layernorm_forward(int rows, int features, float epsilon, const float* x, const float* gamma,
                         const float* beta, float* y, float* mean, float* rstd) override {
    host_layernorm_forward(rows, features, epsilon, x, gamma, beta, y, mean, rstd);
  }
  void layernorm_backward(int rows, int features, const float* x, const float* dy,
                          const float* gamma, const float* mean, const float* rstd, float* dx,
                          float* dgamma, float* dbeta) override {
    host_layernorm_backward(rows, features, x, dy, gamma, mean, rstd, dx, dgamma, dbeta);
  }
  // Attention's products by small_gemm.h's tiles where the shape suits them, else oneDNN's
  // sgemm; one per pair inside the pairs' loop (one thread each: its bits do not depend on
  // OMP_NUM_THREADS); the softmax and masks are host loops.
  static void attention_product(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                                const float* b, int ldb, float* c, int ldc, Causal causal) {
    if (small_gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, causal)) return;
    dnnl_status_t rc =
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    DT_ENFORCE(rc == dnnl_success, "attention's sgemm failed with status {}", static_cast<int>(rc));
  }
  void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                         float* probs, float* y) override {
    host_attention_forward(s, q, k, v, probs, y, direct_conv::Vectors::kWidest, attention_product);
  }
  void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                          const float* probs, const float* dy, float* dq, float* dk,
                          float* dv) override {
    host_attention_backward(s, q, k, v, probs, dy, dq, dk, dv, direct_conv::Vectors::kWidest,
                            attention_product);
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

  // GELU on host_eltwise.h's loops (oneDNN's gelu_erf took twice as long backward); the others
  // on oneDNN's.
  void eltwise_forward(Eltwise f, size_t count, const float* x, float* y) override {
    if (f == Eltwise::kGelu) {
      host_gelu_forward(count, x, y);
      return;
    }
    ReluPrimitives& p = eltwise(f, count);
    p.forward.execute(stream_, {{DNNL_ARG_SRC, mem(p.data, x)}, {DNNL_ARG_DST, mem(p.data, y)}});
    stream_.wait();
  }
  void eltwise_backward(Eltwise f, size_t count, const float* x, const float* dy,
                        float* dx) override {
    if (f == Eltwise::kGelu) {
      host_gelu_backward(count, x, dy, dx);
      return;
    }
    ReluPrimitives& p = eltwise(f, count);
    p.backward.execute(stream_, {{DNNL_ARG_SRC, mem(p.data, x)},
                                 {DNNL_ARG_DIFF_DST, mem(p.data, dy)},
                                 {DNNL_ARG_DIFF_SRC, mem(p.data, dx)}});
    stream_.wait();
  }

  void avgpool_forward(const PoolShape& s, const float* x, float* y) override {
    PoolPrimitives& p = pool(s, dnnl::algorithm::pooling_avg_exclude_padding);
    p.forward.execute(stream_, {{DNNL_ARG_SRC, mem(p.src, x)}, {DNNL_ARG_DST, mem(p.dst, y)}});
    stream_.wait();
  }
  void avgpool_backward(const PoolShape& s, const float* dy, float* dx) override {
    PoolPrimitives& p = pool(s, dnnl::algorithm::pooling_avg_exclude_padding);
    p.backward.execute(stream_,
                       {{DNNL_ARG_DIFF_DST, mem(p.dst, dy)}, {DNNL_ARG_DIFF_SRC, mem(p.src, dx)}});
    stream_.wait();
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

  void begin_dense_backward(const float* dy, size_t count) override { held_ = {dy, count, false}; }
  void end_dense_backward() override { held_ = {}; }

 private:
  // dy rounded to bf16: once while begin_dense_backward() holds it (the weight gradient's pieces
  // and dx share the copy), else at each call.
  const uint16_t* rounded_gradient(const float* dy, size_t count) {
    if (held_.dy == dy && held_.count == count) {
      if (held_.rounded) return rounder_.reuse(dy, count, stream_);
      held_.rounded = true;
    }
    return rounder_.round(dy, count, stream_);
  }
  bool bf16() const { return mode_ == MathMode::kBfloat16; }
  // Row-major C = A op B (+ beta C) with oneDNN's sgemm.
  static void gemm(char ta, char tb, int m, int n, int k, const float* a, int lda, const float* b,
                   int ldb, float beta, float* c, int ldc) {
    dnnl_status_t rc = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    DT_ENFORCE(rc == dnnl_success, "dnnl_sgemm failed with status {}", static_cast<int>(rc));
  }
  memory mem(const memory::desc& md, const void* data) {
    return memory(md, engine_, const_cast<void*>(data));
  }
  // y = x w + b (then relu); in bf16 on rounded copies of x and w that the backward pass reuses
  // (the gradient is of the weights the forward used).
  //
  // In float32 the forward product and the weight gradient's go through oneDNN's sgemm, which
  // beats its matmul primitive inside a training step (the matmul packs the 21632 x 128 weights
  // again each call); the backward data product, with w transposed, is the other way round
  // (docs/benchmarks.md, issue 29's profile).
  void dense(int n, int in, int out, const float* x, const float* w, const float* b, float* y,
             bool relu) {
    if (!bf16()) {
      for (int i = 0; i < n; ++i)
        std::memcpy(y + static_cast<size_t>(i) * out, b, sizeof(float) * out);
      gemm('N', 'N', n, out, in, x, in, w, out, 1.0f, y, out);
      if (relu) relu_forward(static_cast<size_t>(n) * out, y, y);
      return;
    }
    MatmulShape shape{n, out, in, in, 1, out, 1, out, true, relu, true};
    const uint16_t* x16 = rounder_.round(x, static_cast<size_t>(n) * in, stream_);
    if (Packed packed = pack(w, in, out, shape); packed.product)
      return packed.product->run(stream_, x16, packed.weights, b, y);
    const uint16_t* w16 = rounder_.round(w, static_cast<size_t>(in) * out, stream_);
    matmul(shape).run(stream_, x16, w16, b, y);
  }
  // w (in x out) rounded in one pass into the blocked layout of the forward's product (so the
  // primitive does not pack it at each call) and into the plain copy the backward's product
  // reuses (docs/design.md#rounding-to-bf16): the product made for the blocked layout, and the
  // blocked copy; both null where the CPU or the shape does not allow it.
  struct Packed {
    Matmul* product = nullptr;
    const uint16_t* weights = nullptr;
  };
  Packed pack(const float* w, int in, int out, const MatmulShape& shape) {
    if (!bf16_rounding::vectorized() || in % 64 != 0 || out % 64 != 0) return {};
    MatmulShape blocked = shape;
    blocked.packed_b = true;
    Matmul& product = matmul(blocked);
    if (!product.b_blocked_64()) return {};
    const size_t count = static_cast<size_t>(in) * out;
    std::vector<uint16_t>& copy = packed_[w];
    copy.resize(count);
    if (!bf16_rounding::pack_vectorized(w, in, out, copy.data(), rounder_.slot(w, count))) {
      rounder_.drop(w, count);  // the slot was not filled
      return {};
    }
    return {&product, copy.data()};
  }
  void conv_forward(const ConvShape& s, const float* x, const float* w, const float* b, float* y,
                    bool relu) {
    if (!direct(s)) return conv(s).forward(stream_, x, w, b, y, relu);
    if (s.y_layout == Layout::kPlain) return direct_conv::forward(s, x, w, b, y, relu, bf16());
    float* rows = staging(s, 0);  // the direct loops write NCHW rows
    direct_conv::forward(s, x, w, b, rows, relu, bf16());
    reorder_channels(s.n, s.k, s.oh() * s.ow(), Layout::kBlocked, rows, y);
  }
  // A direct convolution's y-shaped tensor t in plain NCHW: t itself, or (y in blocks of
  // channels) its reorder into staging buffer `slot`.
  const float* plain_output(const ConvShape& s, const float* t, int slot) {
    if (!t || s.y_layout == Layout::kPlain) return t;
    float* rows = staging(s, slot);
    reorder_channels(s.n, s.k, s.oh() * s.ow(), Layout::kPlain, t, rows);
    return rows;
  }
  float* staging(const ConvShape& s, int slot) {
    std::vector<float>& v = staging_[slot];
    if (v.size() < s.output_count()) v.resize(s.output_count());
    return v.data();
  }
  // The direct loops read x and write y as NCHW rows: a blocked x (a 1x1 convolution of 16
  // channels) or a blocked y (a first layer followed by a blocked layer) is oneDNN's, whose
  // first-layer kernels write blocked y from NCHW x in one pass.
  bool direct(const ConvShape& s) {
    if (!direct_suits(s)) return false;
    direct_used_ = true;
    return true;
  }
  static bool direct_suits(const ConvShape& s) {
    return s.x_layout != Layout::kBlocked && s.y_layout != Layout::kBlocked &&
           direct_conv::suits(s);
  }
  // An optimizer update changed [w, w + count): rounded copies of it are stale.
  void updated(const float* w, size_t count) {
    if (bf16()) rounder_.drop(w, count);
  }

  Conv& conv(const ConvShape& s);
  Matmul& matmul(const MatmulShape& s);
  PoolPrimitives& pool(const PoolShape& s,
                       dnnl::algorithm algorithm = dnnl::algorithm::pooling_max);
  ReluPrimitives& relu(size_t count);
  ReluPrimitives& eltwise(Eltwise f, size_t count);

  MathMode mode_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  Rounder rounder_;
  struct HeldGradient {
    const float* dy = nullptr;
    size_t count = 0;
    bool rounded = false;  ///< rounder_ holds its copy
  } held_;
  // A dense kernel's bf16 copy in its forward product's blocked layout, by the kernel's
  // address; rewritten at each forward, read only there.
  std::map<const float*, std::vector<uint16_t>> packed_;
  std::map<std::string, std::unique_ptr<Conv>> convs_;
  std::map<std::string, std::unique_ptr<Matmul>> matmuls_;
  std::map<std::string, std::unique_ptr<PoolPrimitives>> pools_;
  std::map<size_t, std::unique_ptr<ReluPrimitives>> relus_;
  std::map<std::pair<Eltwise, size_t>, std::unique_ptr<ReluPrimitives>> eltwises_;
  std::vector<float> row_losses_;  ///< softmax_cross_entropy's per row, summed in order
  std::vector<uint8_t> row_hits_;
  bool direct_used_ = false;  // a convolution ran direct_conv.h's loops
  // A blocked ReLU-fused batch normalization's factors from its training forward, by the mean it
  // wrote (the layer's own buffer), so that the backward of that forward takes the ReLU's mask
  // from x (host_norm.h); used only while the statistics and gamma are still the forward's.
  struct NormFactors {
    std::vector<float> mean, var, gamma, scale, shift;
  };
  const NormFactors* factors_of(const NormShape& s, const float* gamma, const float* mean,
                                const float* var) const {
    if (s.layout != Layout::kBlocked || !s.relu) return nullptr;
    auto found = norm_factors_.find(mean);
    if (found == norm_factors_.end()) return nullptr;
    const NormFactors& f = found->second;
    const size_t c = static_cast<size_t>(s.c);
    auto same = [&](const std::vector<float>& kept, const float* now) {
      return kept.size() == (now ? c : 0) && (!now || std::equal(kept.begin(), kept.end(), now));
    };
    return same(f.mean, mean) && same(f.var, var) && same(f.gamma, gamma) ? &f : nullptr;
  }
  std::map<const float*, NormFactors> norm_factors_;
  bool blocked_channels_;
  std::vector<float> staging_[2];  ///< a direct convolution's plain y or dy (blocked_channels_)
  std::map<std::string, dnnl::reorder> channel_reorders_;
};

void DnnlBackend::reorder_channels(int n, int c, int hw, Layout to, const float* x, float* y) {
  DT_ENFORCE(c % kChannelBlock == 0, "{} channels do not fill blocks of {}", c, kChannelBlock);
  auto& slot = channel_reorders_[fmt::format("{} {} {} {}", n, c, hw, static_cast<int>(to))];
  const memory::desc nchw({n, c, hw, 1}, Dt::f32, Tag::nchw),
      blocked({n, c, hw, 1}, Dt::f32, Tag::nChw16c);
  const memory::desc& from = to == Layout::kBlocked ? nchw : blocked;
  const memory::desc& into = to == Layout::kBlocked ? blocked : nchw;
  if (!slot) slot = dnnl::reorder(dnnl::reorder::primitive_desc(engine_, from, engine_, into));
  memory source(from, engine_, const_cast<float*>(x)), target(into, engine_, y);
  slot.execute(stream_, source, target);
  stream_.wait();
}

Conv& DnnlBackend::conv(const ConvShape& s) {
  auto& slot = convs_[key_of(s)];
  if (!slot) slot = std::make_unique<Conv>(s, mode_, engine_);
  return *slot;
}

Matmul& DnnlBackend::matmul(const MatmulShape& s) {
  auto& slot =
      matmuls_[fmt::format("{} {} {} {} {} {} {} {} {} {} {} {}", s.m, s.n, s.k, s.a_row, s.a_col,
                           s.b_row, s.b_col, s.ldc, s.bias, s.relu, s.bf16, s.packed_b)];
  if (!slot) slot = std::make_unique<Matmul>(s, engine_);
  return *slot;
}

std::string DnnlBackend::implementations() const {
  std::set<std::string> conv, matmul;
  if (direct_used_)
    conv.insert(fmt::format("direct:nchw:{}", direct_conv::vectors_name(direct_conv::widest())));
  for (const auto& [key, c] : convs_)
    for (const std::string& name : c->implementations()) conv.insert(name);
  for (const auto& [key, m] : matmuls_) matmul.insert(m->implementation());
  auto join = [](const std::set<std::string>& names) {
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
    return out.empty() ? std::string("none yet") : out;
  };
  return fmt::format("convolution {}; matmul {}", join(conv), join(matmul));
}

// Padding (TensorFlow's "same") is never taken part in: oneDNN's max pooling reads it as the
// lowest value, and pooling_avg_exclude_padding divides by the elements inside the input.
PoolPrimitives& DnnlBackend::pool(const PoolShape& s, dnnl::algorithm algorithm) {
  auto& slot = pools_[key_of(s) + (algorithm == dnnl::algorithm::pooling_max ? "max" : "avg")];
  if (slot) return *slot;
  auto p = std::make_unique<PoolPrimitives>();
  p->src = plain({s.n, s.c, s.h, s.w}, Tag::nchw);
  p->dst = plain({s.n, s.c, s.oh(), s.ow()}, Tag::nchw);
  memory::dims strides = {s.sh, s.sw}, kernel = {s.kh, s.kw};
  memory::dims pad_l = {s.pad_top, s.pad_left}, pad_r = {s.pad_bottom, s.pad_right};
  dnnl::pooling_forward::primitive_desc fwd(
      {dnnl::prop_kind::forward_training, algorithm, p->src, p->dst, strides, kernel, pad_l, pad_r},
      engine_);
  dnnl::pooling_backward::primitive_desc bwd(
      {algorithm, p->src, p->dst, strides, kernel, pad_l, pad_r}, engine_, fwd);
  p->workspace = fwd.workspace_desc();
  p->forward = dnnl::pooling_forward(fwd);
  p->backward = dnnl::pooling_backward(bwd);
  slot = std::move(p);
  return *slot;
}

// Backward from the forward's input (the src variants: swish has no dst form).
ReluPrimitives& DnnlBackend::eltwise(Eltwise f, size_t count) {
  auto& slot = eltwises_[{f, count}];
  if (slot) return *slot;
  dnnl::algorithm algorithm = dnnl::algorithm::eltwise_logistic;
  float alpha = 0.0f;
  switch (f) {
    case Eltwise::kSigmoid:
      break;
    case Eltwise::kTanh:
      algorithm = dnnl::algorithm::eltwise_tanh;
      break;
    case Eltwise::kGelu:  // host_eltwise.h's loops (eltwise_forward, eltwise_backward)
      DT_ENFORCE(false, "GELU has no oneDNN primitive here");
      break;
    case Eltwise::kSwish:  // x * sigmoid(alpha x)
      algorithm = dnnl::algorithm::eltwise_swish, alpha = 1.0f;
      break;
  }
  auto p = std::make_unique<ReluPrimitives>();
  p->data = plain({static_cast<memory::dim>(count)}, Tag::x);
  dnnl::eltwise_forward::primitive_desc fwd(
      {dnnl::prop_kind::forward_training, algorithm, p->data, alpha, 0.0f}, engine_);
  dnnl::eltwise_backward::primitive_desc bwd({algorithm, p->data, p->data, alpha, 0.0f}, engine_,
                                             fwd);
  p->forward = dnnl::eltwise_forward(fwd);
  p->backward = dnnl::eltwise_backward(bwd);
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

void DnnlBackend::softmax_cross_entropy(int n, int classes, const float* logits,
                                        const int32_t* labels, float* dlogits, float* totals) {
  for (int i = 0; i < n; ++i) {
    DT_ENFORCE(labels[i] >= 0 && labels[i] < classes, "label {} outside 0..{}", labels[i],
               classes - 1);
  }
  // Each row's log-softmax, its loss and hit and its gradient (softmax - onehot) / n in one pass
  // on host_eltwise.h's vector loops (a language model has a row per token and an exponential
  // per logit); each row's loss and hit kept apart and summed afterwards in row order, so the
  // totals are the same bits at any thread count.
  row_losses_.resize(static_cast<size_t>(n));
  row_hits_.resize(static_cast<size_t>(n));
  host_softmax_cross_entropy(n, classes, logits, labels, 1.0f / static_cast<float>(n), dlogits,
                             row_losses_.data(), row_hits_.data());
  const float* row_losses = row_losses_.data();
  const uint8_t* row_hits = row_hits_.data();
  double loss = 0;
  int hits = 0;
  for (int i = 0; i < n; ++i) {
    loss -= row_losses[i];
    hits += row_hits[i];
  }
  totals[0] = static_cast<float>(totals[0] + loss);
  totals[1] += static_cast<float>(hits);
  totals[2] += static_cast<float>(n);
}

// The updates are Keras's, element by element, through streamed_update::run (each lambda reads
// its element's inputs before it sets the outputs, which may be those same elements).
void DnnlBackend::sgd_update(const SgdParams& gated_params, size_t count, float* w, const float* g,
                             float* velocity) {
  SgdParams p = gated_params;
  if (!gated(p)) return;
  updated(w, count);
  const float lr = p.learning_rate, mu = p.momentum;
  const int64_t n = static_cast<int64_t>(count);
  if (mu == 0.0f) {
    streamed_update::run(
        n, [=](int64_t i, float& new_w) { new_w = w[i] - lr * g[i]; }, w);
    return;
  }
  const bool nesterov = p.nesterov;
  if (nesterov) {
    streamed_update::run(
        n,
        [=](int64_t i, float& new_w, float& new_velocity) {
          const float v = mu * velocity[i] - lr * g[i];
          new_velocity = v;
          new_w = w[i] + (mu * v - lr * g[i]);
        },
        w, velocity);
    return;
  }
  streamed_update::run(
      n,
      [=](int64_t i, float& new_w, float& new_velocity) {
        const float v = mu * velocity[i] - lr * g[i];
        new_velocity = v;
        new_w = w[i] + v;
      },
      w, velocity);
}

namespace {

/// Adam's rate at step t (Keras's lr_t: the bias corrections folded into it).
float adam_rate(const AdamParams& p, int64_t step) {
  DT_ENFORCE(step >= 1, "Adam step {} (counts from 1)", step);
  const double t = static_cast<double>(step);
  return static_cast<float>(p.learning_rate * std::sqrt(1.0 - std::pow(p.beta_2, t)) /
                            (1.0 - std::pow(p.beta_1, t)));
}

/// Adam's update of n elements at rate lr; with decay (AdamW), each weight first loses
/// weight * decay * learning_rate, as Keras's AdamW applies the decay before the Adam step.
template <bool kDecay>
void adam_elements(const AdamParams& p, float lr, float decay, int64_t n, float* w, const float* g,
                   float* m, float* v) {
  const float b1 = p.beta_1, b2 = p.beta_2, eps = p.epsilon, learning_rate = p.learning_rate;
  streamed_update::run(
      n,
      [=](int64_t i, float& new_w, float& new_m, float& new_v) {
        float weight = w[i];
        if constexpr (kDecay) weight -= weight * decay * learning_rate;
        const float mi = m[i] + (g[i] - m[i]) * (1.0f - b1);
        const float vi = v[i] + (g[i] * g[i] - v[i]) * (1.0f - b2);
        new_m = mi;
        new_v = vi;
        new_w = weight - lr * mi / (std::sqrt(vi) + eps);
      },
      w, m, v);
}

}  // namespace

void DnnlBackend::adam_update(const AdamParams& gated_params, int64_t step, size_t count, float* w,
                              const float* g, float* m, float* v) {
  AdamParams p = gated_params;
  if (!gated(p, &step)) return;
  const float lr = adam_rate(p, step);
  updated(w, count);
  adam_elements<false>(p, lr, 0.0f, static_cast<int64_t>(count), w, g, m, v);
}

void DnnlBackend::rmsprop_update(const RmspropParams& gated_params, size_t count, float* w,
                                 const float* g, float* velocity, float* momentum_slot,
                                 float* average_gradient) {
  RmspropParams p = gated_params;
  if (!gated(p)) return;
  const float lr = p.learning_rate, rho = p.rho, mu = p.momentum, eps = p.epsilon;
  updated(w, count);
  const int64_t n = static_cast<int64_t>(count);
  // velocity, then (centered) the average gradient, then the increment, taken by the momentum
  // slot (momentum > 0) or straight from the weight.
  auto increment = [=](int64_t i, float& new_velocity, float* new_average) {
    const float vi = rho * velocity[i] + (1.0f - rho) * g[i] * g[i];
    float denominator = vi + eps;
    if (new_average != nullptr) {
      const float ai = rho * average_gradient[i] + (1.0f - rho) * g[i];
      *new_average = ai;
      denominator = vi - ai * ai + eps;
    }
    new_velocity = vi;
    return lr * g[i] / std::sqrt(denominator);
  };
  if (p.centered && mu > 0.0f) {
    streamed_update::run(
        n,
        [=](int64_t i, float& new_w, float& new_velocity, float& new_momentum, float& new_average) {
          const float step = increment(i, new_velocity, &new_average);
          const float momentum = mu * momentum_slot[i] + step;
          new_momentum = momentum;
          new_w = w[i] - momentum;
        },
        w, velocity, momentum_slot, average_gradient);
  } else if (p.centered) {
    streamed_update::run(
        n,
        [=](int64_t i, float& new_w, float& new_velocity, float& new_average) {
          const float step = increment(i, new_velocity, &new_average);
          new_w = w[i] - step;
        },
        w, velocity, average_gradient);
  } else if (mu > 0.0f) {
    streamed_update::run(
        n,
        [=](int64_t i, float& new_w, float& new_velocity, float& new_momentum) {
          const float step = increment(i, new_velocity, nullptr);
          const float momentum = mu * momentum_slot[i] + step;
          new_momentum = momentum;
          new_w = w[i] - momentum;
        },
        w, velocity, momentum_slot);
  } else {
    streamed_update::run(
        n,
        [=](int64_t i, float& new_w, float& new_velocity) {
          const float step = increment(i, new_velocity, nullptr);
          new_w = w[i] - step;
        },
        w, velocity);
  }
}

void DnnlBackend::adamw_update(const AdamWParams& gated_params, int64_t step, size_t count,
                               float* w, const float* g, float* m, float* v) {
  AdamWParams p = gated_params;
  if (!gated(p, &step)) return;
  const AdamParams adam{p.learning_rate, p.beta_1, p.beta_2, p.epsilon};
  const float lr = adam_rate(adam, step);
  updated(w, count);
  adam_elements<true>(adam, lr, p.weight_decay, static_cast<int64_t>(count), w, g, m, v);
}

}  // namespace

namespace {

std::unique_ptr<Backend> dnnl_backend(MathMode mode, bool blocked_channels) {
  if (mode == MathMode::kTf32) mode = MathMode::kFloat32;
  if (!cpu_supports(mode))
    throw common::ConfigError(
        fmt::format("this CPU ({}) cannot compute in {}", cpu_isa_name(), math_mode_name(mode)));
  return std::make_unique<DnnlBackend>(mode, blocked_channels);
}

}  // namespace

std::unique_ptr<Backend> make_dnnl_backend(MathMode mode) {
  return dnnl_backend(mode, true);
}

std::unique_ptr<Backend> make_plain_dnnl_backend(MathMode mode) {
  return dnnl_backend(mode, false);
}

bool cpu_supports(MathMode mode) {
  switch (mode) {
    case MathMode::kFloat32:
    case MathMode::kTf32:
      return true;
    case MathMode::kBfloat16: {  // oneDNN emulates bf16 on plain AVX-512, slower than float32
      dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
      return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
    }
    case MathMode::kFloat16:  // no float16 products in this oneDNN on any CPU
      return false;
  }
  return false;
}

bool own_kernels_may_use(VectorIsa isa) {
  static const int level = [] {  // 0: below AVX2, 1: AVX2, 2: AVX-512, 3: with AVX512_BF16
    switch (dnnl::get_effective_cpu_isa()) {
      case dnnl::cpu_isa::avx512_core_amx:
      case dnnl::cpu_isa::avx512_core_bf16:
        return 3;
      case dnnl::cpu_isa::avx512_core_vnni:
      case dnnl::cpu_isa::avx512_core:
        return 2;
      case dnnl::cpu_isa::avx2_vnni:
      case dnnl::cpu_isa::avx2:
        return 1;
      default:
        return 0;
    }
  }();
  switch (isa) {
    case VectorIsa::kAvx2:
      return level >= 1;
    case VectorIsa::kAvx512:
      return level >= 2;
    case VectorIsa::kAvx512Bf16:
      return level >= 3;
  }
  return false;
}

std::string cpu_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::sse41:
      return "sse41";
    default:
      return "other";
  }
}

}  // namespace dtrain::nn
