// A Backend decorator that times every call of the backend it wraps, on the host's steady clock,
// and sums the times per label: the operation and its shape ("conv2d_relu_forward 64x1x28x28 k32
// 3x3", "dense_forward 64x21632->128", "sgd_update 2769290"), so each layer's forward and
// backward show separately. Every call is forwarded to the same method of the wrapped backend,
// fused ones included, so the wrapped backend's own fusions still run. For benchmarks
// (bench/step_bench --profile); it does not change what is computed, and it is not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "worker/nn/backend.h"

namespace dtrain::nn {

/// One row of the profile: every call with this label since the last reset.
struct OpTime {
  std::string label;
  int64_t calls = 0;
  double seconds = 0;
};

class ProfiledBackend final : public Backend {
 public:
  /// Wraps backend, which must outlive this. On the host device a call has finished when it
  /// returns, so its time is its own. On any other device (CUDA) calls only enqueue: then every
  /// call is bracketed by device().synchronize(), before and after, so each time is the device's
  /// time for that call alone. That serializes the device and so slows the whole step, and it
  /// cannot run inside a graph capture: profile eager steps only.
  explicit ProfiledBackend(Backend& backend);

  /// The rows in the order their labels were first called (a step's order, after one step).
  std::vector<OpTime> table() const { return rows_; }
  /// Forgets every row.
  void reset();
  /// Whether calls are bracketed by device synchronizations (not the host device).
  bool synchronizes() const { return synchronize_; }

  /// The wrapped backend's name, device, scratch generation and math mode.
  std::string name() const override { return inner_.name(); }
  Device& device() override { return inner_.device(); }
  uint64_t scratch_generation() const override { return inner_.scratch_generation(); }
  MathMode math_mode() const override { return inner_.math_mode(); }
  std::string implementations() const override { return inner_.implementations(); }
  bool blocks_channels() const override { return inner_.blocks_channels(); }
  bool makes_rounded_copies() const override { return inner_.makes_rounded_copies(); }
  bool conv2d_backward_reads_rounded_only(const ConvShape& s) override {
    return inner_.conv2d_backward_reads_rounded_only(s);
  }
  bool conv2d_forward_reads_rounded_only(const ConvShape& s) override {
    return inner_.conv2d_forward_reads_rounded_only(s);
  }
  void reorder_channels(int n, int c, int hw, Layout to, const float* x, float* y) override;

  void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                      float* y) override;
  void conv2d_relu_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                           float* y) override;
  void conv2d_relu_backward_weights(const ConvShape& s, const float* x, const float* y,
                                    const float* dy, float* dw, float* db, float* scratch) override;
  void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                            float* dx) override;
  /// Times its two products as the separate calls would: conv2d_backward_weights up to
  /// weights_done, conv2d_backward_data after it.
  void conv2d_backward(const ConvShape& s, const float* x, const float* dy, const float* w,
                       float* dx, float* dw, float* db,
                       const std::function<void()>& weights_done) override;
  void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                               float* db) override;
  /// Timed under conv2d_forward's and conv2d_backward's labels.
  void conv2d_forward_rounded(const ConvShape& s, const float* x, const uint16_t* x16,
                              const float* w, const float* b, float* y) override;
  void conv2d_backward_rounded(const ConvShape& s, const float* x, const float* dy,
                               const uint16_t* dy16, const float* w, float* dx, float* dw,
                               float* db, const std::function<void()>& weights_done) override;

  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override;
  void dense_relu_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                          float* y) override;
  void dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                           float* dx) override;
  void dense_backward_weights(int n, int in, int out, const float* x, const float* dy, float* dw,
                              float* db) override;
  /// Timed under one label per layer shape whatever the rows, so a kernel's gradient produced
  /// in row blocks is one row of the profile with a call per block.
  void dense_backward_weight_rows(int n, int in, int out, const float* x, const float* dy,
                                  float* dw, int row_begin, int row_end) override;
  void dense_backward_bias(int n, int out, const float* dy, float* db) override;
  void begin_dense_backward(const float* dy, size_t count) override {
    inner_.begin_dense_backward(dy, count);
  }
  void end_dense_backward() override { inner_.end_dense_backward(); }

  void relu_forward(size_t count, const float* x, float* y) override;
  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override;
  void relu_backward_added(size_t count, const float* y, const float* dy, const float* addend,
                           float* dx) override;
  void eltwise_forward(Eltwise f, size_t count, const float* x, float* y) override;
  void eltwise_backward(Eltwise f, size_t count, const float* x, const float* dy,
                        float* dx) override;
  void avgpool_forward(const PoolShape& s, const float* x, float* y) override;
  void avgpool_backward(const PoolShape& s, const float* dy, float* dx) override;

  /// A size query, forwarded untimed.
  size_t maxpool_workspace_bytes(const PoolShape& s) override;
  void maxpool_forward(const PoolShape& s, const float* x, float* y, void* workspace) override;
  void maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                        float* dx) override;

  void softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                             float* dlogits, float* totals) override;

  void add(size_t count, const float* x, float* y) override;
  void add_forward(size_t count, const float* const* x, int inputs, bool relu, float* y) override;
  void batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                  const float* gamma, const float* beta, float* y, float* mean,
                                  float* var) override;
  void batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                   const float* gamma, const float* beta, const float* mean,
                                   const float* var, float* y) override;
  void batchnorm_add_forward_training(const NormShape& s, float epsilon, const float* x,
                                      const float* gamma, const float* beta, const float* addend,
                                      bool relu, float* y, float* mean, float* var) override;
  void batchnorm_add_forward_inference(const NormShape& s, float epsilon, const float* x,
                                       const float* gamma, const float* beta, const float* mean,
                                       const float* var, const float* addend, bool relu,
                                       float* y) override;
  void batchnorm_backward(const NormShape& s, float epsilon, const float* x, const float* y,
                          const float* dy, const float* gamma, const float* mean, const float* var,
                          float* dx, float* dgamma, float* dbeta) override;
  void batchnorm_sums(const NormShape& s, const float* x, const float* center,
                      float* sums) override;
  void batchnorm_backward_data(const NormShape& s, float epsilon, const float* x, const float* y,
                               const float* dy, const float* gamma, const float* mean,
                               const float* var, const float* totals, double count,
                               float* dx) override;
  void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                         float* probs, float* y) override;
  void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                          const float* probs, const float* dy, float* dq, float* dk,
                          float* dv) override;
  void embedding_forward(int rows, int input_dim, int output_dim, const float* ids,
                         const float* table, float* y) override;
  void embedding_backward(int rows, int input_dim, int output_dim, const float* ids,
                          const float* dy, float* dtable) override;
  void layernorm_forward(int rows, int features, float epsilon, const float* x, const float* gamma,
                         const float* beta, float* y, float* mean, float* rstd) override;
  void layernorm_backward(int rows, int features, const float* x, const float* dy,
                          const float* gamma, const float* mean, const float* rstd, float* dx,
                          float* dgamma, float* dbeta) override;
  void moving_average_update(size_t count, float momentum, int shards, const float* sum,
                             float* moving) override;
  void remap2d_forward(int n, int c, int h, int w, int oh, int ow, const PixelMap* maps,
                       const float* x, float* y) override;
  void decay_weights(const DecayParams& p, size_t count, float* w) override;
  void translate2d_forward(const TranslateShape& s, const Shift2d* shifts, const float* x,
                           float* y) override;
  void translate2d_backward(const TranslateShape& s, const Shift2d* shifts, const float* dy,
                            float* dx) override;
  void scale_shift(size_t count, float scale, float offset, const float* x, float* y) override;
  void permute_forward(int n, int m, const int32_t* index, const float* x, float* y) override;
  void permute_backward(int n, int m, const int32_t* index, const float* dy, float* dx) override;
  void regularize(size_t count, float l1, float l2, const float* w, float* g,
                  float* penalty) override;
  void add_penalty(const float* penalty, float* totals) override;
  void sum_squares(size_t count, const float* g, float* sum) override;
  void clip_by_norm(size_t count, float clip, bool global, const float* sum, float* g) override;
  void softmax_cross_entropy_smoothed(int n, int classes, float smoothing, const float* logits,
                                      const int32_t* labels, float* dlogits,
                                      float* totals) override;
  void target_loss(const TargetLossShape& s, const float* outputs, const int32_t* targets,
                   float* doutputs, float* totals) override;
  void remap2d_backward(int n, int c, int h, int w, int oh, int ow, const PixelMap* maps,
                        const float* dy, float* dx) override;
  void dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                       float* mask) override;
  void multiply(size_t count, const float* a, const float* b, float* y) override;

  void sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                  float* velocity) override;
  void adam_update(const AdamParams& p, int64_t step, size_t count, float* w, const float* g,
                   float* m, float* v) override;
  void rmsprop_update(const RmspropParams& p, size_t count, float* w, const float* g,
                      float* velocity, float* momentum_slot, float* average_gradient) override;
  void adamw_update(const AdamWParams& p, int64_t step, size_t count, float* w, const float* g,
                    float* m, float* v) override;
  void scale(size_t count, const float* factor, float* x) override;
  void unscale_gradients(size_t count, const float* scale, float* g, float* nonfinite) override;
  void update_loss_scale(float* state, int64_t growth_steps) override;

 private:
  /// Runs backward (a conv2d_backward of inner_, given the weights_done it is to call), timed as
  /// conv2d_backward's two labels; with_dx: it computes dx.
  void timed_backward(const ConvShape& s, bool with_dx, const std::function<void()>& weights_done,
                      const std::function<void(const std::function<void()>&)>& backward);
  /// Runs op (a call of inner_), timed, and adds its time to label's row.
  template <class Op>
  void timed(const std::string& label, Op&& op);
  /// Adds seconds to label's row as one call.
  void record(const std::string& label, double seconds);

  Backend& inner_;
  bool synchronize_ = false;
  std::vector<OpTime> rows_ = {};
  std::unordered_map<std::string, size_t> row_of_ = {};  ///< label -> index in rows_
};

}  // namespace dtrain::nn
