// ProfiledBackend: each method builds its label from the shape, forwards the call to the wrapped
// backend's same method, and adds the call's steady-clock time to that label's row. Labels are
// built outside the timed interval, so their cost shows as the caller's, not the operation's.
#include "worker/nn/profiled_backend.h"

#include <fmt/format.h>

#include <chrono>
#include <utility>

namespace dtrain::nn {
namespace {

// "64x1x28x28 k32 3x3", with " s2x2" and " pad 1,1,1,1" (top, bottom, left, right) when not 1
// and not 0.
std::string conv_label(const char* op, const ConvShape& s) {
  std::string label =
      fmt::format("{} {}x{}x{}x{} k{} {}x{}", op, s.n, s.c, s.h, s.w, s.k, s.kh, s.kw);
  if (s.sh != 1 || s.sw != 1) label += fmt::format(" s{}x{}", s.sh, s.sw);
  if (s.pad_top || s.pad_bottom || s.pad_left || s.pad_right)
    label += fmt::format(" pad {},{},{},{}", s.pad_top, s.pad_bottom, s.pad_left, s.pad_right);
  if (s.x_layout == Layout::kBlocked || s.y_layout == Layout::kBlocked)
    label += fmt::format(" blocked {}{}", s.x_layout == Layout::kBlocked ? "x" : "",
                         s.y_layout == Layout::kBlocked ? "y" : "");
  return label;
}

// "64x32x26x26 2x2 s2x2".
std::string pool_label(const char* op, const PoolShape& s) {
  return fmt::format("{} {}x{}x{}x{} {}x{} s{}x{}", op, s.n, s.c, s.h, s.w, s.kh, s.kw, s.sh, s.sw);
}

// "64x21632->128".
std::string dense_label(const char* op, int n, int in, int out) {
  return fmt::format("{} {}x{}->{}", op, n, in, out);
}

std::string count_label(const char* op, size_t count) {
  return fmt::format("{} {}", op, count);
}

}  // namespace

ProfiledBackend::ProfiledBackend(Backend& backend)
    : inner_(backend), synchronize_(backend.device().kind() != DeviceKind::kHost) {}

void ProfiledBackend::reset() {
  rows_.clear();
  row_of_.clear();
}

template <class Op>
void ProfiledBackend::timed(const std::string& label, Op&& op) {
  using Clock = std::chrono::steady_clock;
  if (synchronize_) inner_.device().synchronize();
  Clock::time_point start = Clock::now();
  std::forward<Op>(op)();
  if (synchronize_) inner_.device().synchronize();
  record(label, std::chrono::duration<double>(Clock::now() - start).count());
}

void ProfiledBackend::record(const std::string& label, double seconds) {
  auto [it, added] = row_of_.try_emplace(label, rows_.size());
  if (added) rows_.push_back(OpTime{label, 0, 0});
  OpTime& row = rows_[it->second];
  row.calls += 1;
  row.seconds += seconds;
}

void ProfiledBackend::conv2d_forward(const ConvShape& s, const float* x, const float* w,
                                     const float* b, float* y) {
  timed(conv_label("conv2d_forward", s), [&] { inner_.conv2d_forward(s, x, w, b, y); });
}

void ProfiledBackend::conv2d_relu_forward(const ConvShape& s, const float* x, const float* w,
                                          const float* b, float* y) {
  timed(conv_label("conv2d_relu_forward", s), [&] { inner_.conv2d_relu_forward(s, x, w, b, y); });
}

void ProfiledBackend::conv2d_relu_backward_weights(const ConvShape& s, const float* x,
                                                   const float* y, const float* dy, float* dw,
                                                   float* db, float* scratch) {
  timed(conv_label("conv2d_relu_backward_weights", s),
        [&] { inner_.conv2d_relu_backward_weights(s, x, y, dy, dw, db, scratch); });
}

void ProfiledBackend::conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                                           float* dx) {
  timed(conv_label("conv2d_backward_data", s), [&] { inner_.conv2d_backward_data(s, dy, w, dx); });
}

void ProfiledBackend::conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy,
                                              float* dw, float* db) {
  timed(conv_label("conv2d_backward_weights", s),
        [&] { inner_.conv2d_backward_weights(s, x, dy, dw, db); });
}

void ProfiledBackend::conv2d_forward_rounded(const ConvShape& s, const float* x,
                                             const uint16_t* x16, const float* w, const float* b,
                                             float* y) {
  timed(conv_label("conv2d_forward", s),
        [&] { inner_.conv2d_forward_rounded(s, x, x16, w, b, y); });
}

void ProfiledBackend::conv2d_backward(const ConvShape& s, const float* x, const float* dy,
                                      const float* w, float* dx, float* dw, float* db,
                                      const std::function<void()>& weights_done) {
  timed_backward(s, dx != nullptr, weights_done, [&](const std::function<void()>& done) {
    inner_.conv2d_backward(s, x, dy, w, dx, dw, db, done);
  });
}

void ProfiledBackend::conv2d_backward_rounded(const ConvShape& s, const float* x, const float* dy,
                                              const uint16_t* dy16, const float* w, float* dx,
                                              float* dw, float* db,
                                              const std::function<void()>& weights_done) {
  timed_backward(s, dx != nullptr, weights_done, [&](const std::function<void()>& done) {
    inner_.conv2d_backward_rounded(s, x, dy, dy16, w, dx, dw, db, done);
  });
}

void ProfiledBackend::timed_backward(
    const ConvShape& s, bool with_dx, const std::function<void()>& weights_done,
    const std::function<void(const std::function<void()>&)>& backward) {
  using Clock = std::chrono::steady_clock;
  const std::string weights = conv_label("conv2d_backward_weights", s),
                    data = conv_label("conv2d_backward_data", s);
  auto since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  if (synchronize_) inner_.device().synchronize();
  Clock::time_point start = Clock::now();
  backward([&] {
    if (synchronize_) inner_.device().synchronize();
    record(weights, since(start));
    if (weights_done) weights_done();  // the caller's time, as a label's is
    start = Clock::now();
  });
  if (!with_dx) return;
  if (synchronize_) inner_.device().synchronize();
  record(data, since(start));
}

void ProfiledBackend::dense_forward(int n, int in, int out, const float* x, const float* w,
                                    const float* b, float* y) {
  timed(dense_label("dense_forward", n, in, out),
        [&] { inner_.dense_forward(n, in, out, x, w, b, y); });
}

void ProfiledBackend::dense_relu_forward(int n, int in, int out, const float* x, const float* w,
                                         const float* b, float* y) {
  timed(dense_label("dense_relu_forward", n, in, out),
        [&] { inner_.dense_relu_forward(n, in, out, x, w, b, y); });
}

void ProfiledBackend::dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                                          float* dx) {
  timed(dense_label("dense_backward_data", n, in, out),
        [&] { inner_.dense_backward_data(n, in, out, dy, w, dx); });
}

void ProfiledBackend::dense_backward_weights(int n, int in, int out, const float* x,
                                             const float* dy, float* dw, float* db) {
  timed(dense_label("dense_backward_weights", n, in, out),
        [&] { inner_.dense_backward_weights(n, in, out, x, dy, dw, db); });
}

void ProfiledBackend::dense_backward_weight_rows(int n, int in, int out, const float* x,
                                                 const float* dy, float* dw, int row_begin,
                                                 int row_end) {
  timed(dense_label("dense_backward_weight_rows", n, in, out),
        [&] { inner_.dense_backward_weight_rows(n, in, out, x, dy, dw, row_begin, row_end); });
}

void ProfiledBackend::dense_backward_bias(int n, int out, const float* dy, float* db) {
  timed(fmt::format("dense_backward_bias {}x{}", n, out),
        [&] { inner_.dense_backward_bias(n, out, dy, db); });
}

void ProfiledBackend::relu_forward(size_t count, const float* x, float* y) {
  timed(count_label("relu_forward", count), [&] { inner_.relu_forward(count, x, y); });
}

void ProfiledBackend::relu_backward(size_t count, const float* y, const float* dy, float* dx) {
  timed(count_label("relu_backward", count), [&] { inner_.relu_backward(count, y, dy, dx); });
}
void ProfiledBackend::relu_backward_added(size_t count, const float* y, const float* dy,
                                          const float* addend, float* dx) {
  timed(count_label("relu_backward_added", count),
        [&] { inner_.relu_backward_added(count, y, dy, addend, dx); });
}

void ProfiledBackend::eltwise_forward(Eltwise f, size_t count, const float* x, float* y) {
  timed(count_label(fmt::format("{}_forward", eltwise_name(f)).c_str(), count),
        [&] { inner_.eltwise_forward(f, count, x, y); });
}

void ProfiledBackend::eltwise_backward(Eltwise f, size_t count, const float* x, const float* dy,
                                       float* dx) {
  timed(count_label(fmt::format("{}_backward", eltwise_name(f)).c_str(), count),
        [&] { inner_.eltwise_backward(f, count, x, dy, dx); });
}

void ProfiledBackend::avgpool_forward(const PoolShape& s, const float* x, float* y) {
  timed(pool_label("avgpool_forward", s), [&] { inner_.avgpool_forward(s, x, y); });
}

void ProfiledBackend::avgpool_backward(const PoolShape& s, const float* dy, float* dx) {
  timed(pool_label("avgpool_backward", s), [&] { inner_.avgpool_backward(s, dy, dx); });
}

size_t ProfiledBackend::maxpool_workspace_bytes(const PoolShape& s) {
  return inner_.maxpool_workspace_bytes(s);
}

void ProfiledBackend::maxpool_forward(const PoolShape& s, const float* x, float* y,
                                      void* workspace) {
  timed(pool_label("maxpool_forward", s), [&] { inner_.maxpool_forward(s, x, y, workspace); });
}

void ProfiledBackend::maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                                       float* dx) {
  timed(pool_label("maxpool_backward", s), [&] { inner_.maxpool_backward(s, dy, workspace, dx); });
}

void ProfiledBackend::softmax_cross_entropy(int n, int classes, const float* logits,
                                            const int32_t* labels, float* dlogits, float* totals) {
  timed(fmt::format("softmax_cross_entropy {}x{}", n, classes),
        [&] { inner_.softmax_cross_entropy(n, classes, logits, labels, dlogits, totals); });
}

namespace {
std::string norm_label(const char* op, const NormShape& s) {
  return fmt::format("{}{} {}x{}x{}{}", op, s.relu ? "+relu" : "", s.n, s.c, s.hw,
                     s.layout == Layout::kBlocked ? " blocked" : "");
}
}  // namespace

void ProfiledBackend::batchnorm_forward_training(const NormShape& s, float epsilon, const float* x,
                                                 const float* gamma, const float* beta, float* y,
                                                 float* mean, float* var) {
  timed(norm_label("batchnorm_forward_training", s),
        [&] { inner_.batchnorm_forward_training(s, epsilon, x, gamma, beta, y, mean, var); });
}
void ProfiledBackend::batchnorm_forward_inference(const NormShape& s, float epsilon, const float* x,
                                                  const float* gamma, const float* beta,
                                                  const float* mean, const float* var, float* y) {
  timed(norm_label("batchnorm_forward_inference", s),
        [&] { inner_.batchnorm_forward_inference(s, epsilon, x, gamma, beta, mean, var, y); });
}
void ProfiledBackend::batchnorm_add_forward_training(const NormShape& s, float epsilon,
                                                     const float* x, const float* gamma,
                                                     const float* beta, const float* addend,
                                                     bool relu, float* y, float* mean, float* var) {
  timed(norm_label(relu ? "batchnorm_add_forward_training+relu" : "batchnorm_add_forward_training",
                   s),
        [&] {
          inner_.batchnorm_add_forward_training(s, epsilon, x, gamma, beta, addend, relu, y, mean,
                                                var);
        });
}
void ProfiledBackend::batchnorm_add_forward_inference(const NormShape& s, float epsilon,
                                                      const float* x, const float* gamma,
                                                      const float* beta, const float* mean,
                                                      const float* var, const float* addend,
                                                      bool relu, float* y) {
  timed(norm_label(
            relu ? "batchnorm_add_forward_inference+relu" : "batchnorm_add_forward_inference", s),
        [&] {
          inner_.batchnorm_add_forward_inference(s, epsilon, x, gamma, beta, mean, var, addend,
                                                 relu, y);
        });
}
void ProfiledBackend::batchnorm_backward(const NormShape& s, float epsilon, const float* x,
                                         const float* y, const float* dy, const float* gamma,
                                         const float* mean, const float* var, float* dx,
                                         float* dgamma, float* dbeta) {
  timed(norm_label("batchnorm_backward", s), [&] {
    inner_.batchnorm_backward(s, epsilon, x, y, dy, gamma, mean, var, dx, dgamma, dbeta);
  });
}
void ProfiledBackend::batchnorm_sums(const NormShape& s, const float* x, const float* center,
                                     float* sums) {
  timed(norm_label(center ? "batchnorm_sums squares" : "batchnorm_sums", s),
        [&] { inner_.batchnorm_sums(s, x, center, sums); });
}
void ProfiledBackend::batchnorm_backward_data(const NormShape& s, float epsilon, const float* x,
                                              const float* y, const float* dy, const float* gamma,
                                              const float* mean, const float* var,
                                              const float* totals, double count, float* dx) {
  timed(norm_label("batchnorm_backward_data", s), [&] {
    inner_.batchnorm_backward_data(s, epsilon, x, y, dy, gamma, mean, var, totals, count, dx);
  });
}
namespace {
std::string attention_label(const char* op, const AttentionShape& s) {
  return fmt::format("{} {}x{} heads {}x{}/{}{}", op, s.n, s.t, s.heads, s.key_dim, s.value_dim,
                     s.causal ? " causal" : "");
}
}  // namespace

void ProfiledBackend::attention_forward(const AttentionShape& s, const float* q, const float* k,
                                        const float* v, float* probs, float* y) {
  timed(attention_label("attention_forward", s),
        [&] { inner_.attention_forward(s, q, k, v, probs, y); });
}
void ProfiledBackend::attention_backward(const AttentionShape& s, const float* q, const float* k,
                                         const float* v, const float* probs, const float* dy,
                                         float* dq, float* dk, float* dv) {
  timed(attention_label("attention_backward", s),
        [&] { inner_.attention_backward(s, q, k, v, probs, dy, dq, dk, dv); });
}
void ProfiledBackend::embedding_forward(int rows, int input_dim, int output_dim, const float* ids,
                                        const float* table, float* y) {
  timed(fmt::format("embedding_forward {} of {}x{}", rows, input_dim, output_dim),
        [&] { inner_.embedding_forward(rows, input_dim, output_dim, ids, table, y); });
}
void ProfiledBackend::embedding_backward(int rows, int input_dim, int output_dim, const float* ids,
                                         const float* dy, float* dtable) {
  timed(fmt::format("embedding_backward {} of {}x{}", rows, input_dim, output_dim),
        [&] { inner_.embedding_backward(rows, input_dim, output_dim, ids, dy, dtable); });
}
void ProfiledBackend::layernorm_forward(int rows, int features, float epsilon, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* mean, float* rstd) {
  timed(fmt::format("layernorm_forward {}x{}", rows, features),
        [&] { inner_.layernorm_forward(rows, features, epsilon, x, gamma, beta, y, mean, rstd); });
}
void ProfiledBackend::layernorm_backward(int rows, int features, const float* x, const float* dy,
                                         const float* gamma, const float* mean, const float* rstd,
                                         float* dx, float* dgamma, float* dbeta) {
  timed(fmt::format("layernorm_backward {}x{}", rows, features), [&] {
    inner_.layernorm_backward(rows, features, x, dy, gamma, mean, rstd, dx, dgamma, dbeta);
  });
}
void ProfiledBackend::target_loss(const TargetLossShape& s, const float* outputs,
                                  const int32_t* targets, float* doutputs, float* totals) {
  timed(fmt::format("target_loss {}x{}", s.n, s.units),
        [&] { inner_.target_loss(s, outputs, targets, doutputs, totals); });
}

void ProfiledBackend::softmax_cross_entropy_smoothed(int n, int classes, float smoothing,
                                                     const float* logits, const int32_t* labels,
                                                     float* dlogits, float* totals) {
  timed(fmt::format("softmax_cross_entropy_smoothed {}x{}", n, classes), [&] {
    inner_.softmax_cross_entropy_smoothed(n, classes, smoothing, logits, labels, dlogits, totals);
  });
}
void ProfiledBackend::decay_weights(const DecayParams& p, size_t count, float* w) {
  timed(count_label("decay_weights", count), [&] { inner_.decay_weights(p, count, w); });
}
void ProfiledBackend::scale_shift(size_t count, float scale, float offset, const float* x,
                                  float* y) {
  timed(count_label("scale_shift", count), [&] { inner_.scale_shift(count, scale, offset, x, y); });
}
void ProfiledBackend::permute_forward(int n, int m, const int32_t* index, const float* x,
                                      float* y) {
  timed(fmt::format("permute_forward {}x{}", n, m),
        [&] { inner_.permute_forward(n, m, index, x, y); });
}
void ProfiledBackend::permute_backward(int n, int m, const int32_t* index, const float* dy,
                                       float* dx) {
  timed(fmt::format("permute_backward {}x{}", n, m),
        [&] { inner_.permute_backward(n, m, index, dy, dx); });
}
void ProfiledBackend::translate2d_forward(const TranslateShape& s, const Shift2d* shifts,
                                          const float* x, float* y) {
  timed(fmt::format("translate2d_forward {}x{}x{}x{}", s.n, s.c, s.h, s.w),
        [&] { inner_.translate2d_forward(s, shifts, x, y); });
}
void ProfiledBackend::translate2d_backward(const TranslateShape& s, const Shift2d* shifts,
                                           const float* dy, float* dx) {
  timed(fmt::format("translate2d_backward {}x{}x{}x{}", s.n, s.c, s.h, s.w),
        [&] { inner_.translate2d_backward(s, shifts, dy, dx); });
}
void ProfiledBackend::regularize(size_t count, float l1, float l2, const float* w, float* g,
                                 float* penalty) {
  timed(count_label("regularize", count), [&] { inner_.regularize(count, l1, l2, w, g, penalty); });
}
void ProfiledBackend::add_penalty(const float* penalty, float* totals) {
  timed("add_penalty", [&] { inner_.add_penalty(penalty, totals); });
}
void ProfiledBackend::sum_squares(size_t count, const float* g, float* sum) {
  timed(count_label("sum_squares", count), [&] { inner_.sum_squares(count, g, sum); });
}
void ProfiledBackend::clip_by_norm(size_t count, float clip, bool global, const float* sum,
                                   float* g) {
  timed(count_label("clip_by_norm", count),
        [&] { inner_.clip_by_norm(count, clip, global, sum, g); });
}
void ProfiledBackend::remap2d_forward(int n, int c, int h, int w, int oh, int ow,
                                      const PixelMap* maps, const float* x, float* y) {
  timed(fmt::format("remap2d_forward {}x{}x{}x{}->{}x{}", n, c, h, w, oh, ow),
        [&] { inner_.remap2d_forward(n, c, h, w, oh, ow, maps, x, y); });
}
void ProfiledBackend::remap2d_backward(int n, int c, int h, int w, int oh, int ow,
                                       const PixelMap* maps, const float* dy, float* dx) {
  timed(fmt::format("remap2d_backward {}x{}x{}x{}->{}x{}", n, c, h, w, oh, ow),
        [&] { inner_.remap2d_backward(n, c, h, w, oh, ow, maps, dy, dx); });
}
void ProfiledBackend::moving_average_update(size_t count, float momentum, int shards,
                                            const float* sum, float* moving) {
  timed(count_label("moving_average_update", count),
        [&] { inner_.moving_average_update(count, momentum, shards, sum, moving); });
}
void ProfiledBackend::add_forward(size_t count, const float* const* x, int inputs, bool relu,
                                  float* y) {
  timed(count_label(relu ? "add_forward+relu" : "add_forward", count),
        [&] { inner_.add_forward(count, x, inputs, relu, y); });
}

void ProfiledBackend::add(size_t count, const float* x, float* y) {
  timed(count_label("add", count), [&] { inner_.add(count, x, y); });
}

void ProfiledBackend::dropout_forward(size_t count, float rate, uint64_t key, const float* x,
                                      float* y, float* mask) {
  timed(count_label("dropout_forward", count),
        [&] { inner_.dropout_forward(count, rate, key, x, y, mask); });
}

void ProfiledBackend::multiply(size_t count, const float* a, const float* b, float* y) {
  timed(count_label("multiply", count), [&] { inner_.multiply(count, a, b, y); });
}

void ProfiledBackend::sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                                 float* velocity) {
  timed(count_label("sgd_update", count), [&] { inner_.sgd_update(p, count, w, g, velocity); });
}

void ProfiledBackend::adam_update(const AdamParams& p, int64_t step, size_t count, float* w,
                                  const float* g, float* m, float* v) {
  timed(count_label("adam_update", count), [&] { inner_.adam_update(p, step, count, w, g, m, v); });
}

void ProfiledBackend::rmsprop_update(const RmspropParams& p, size_t count, float* w, const float* g,
                                     float* velocity, float* momentum_slot,
                                     float* average_gradient) {
  timed(count_label("rmsprop_update", count),
        [&] { inner_.rmsprop_update(p, count, w, g, velocity, momentum_slot, average_gradient); });
}

void ProfiledBackend::adamw_update(const AdamWParams& p, int64_t step, size_t count, float* w,
                                   const float* g, float* m, float* v) {
  timed(count_label("adamw_update", count),
        [&] { inner_.adamw_update(p, step, count, w, g, m, v); });
}

void ProfiledBackend::scale(size_t count, const float* factor, float* x) {
  timed(count_label("scale", count), [&] { inner_.scale(count, factor, x); });
}

void ProfiledBackend::unscale_gradients(size_t count, const float* scale, float* g,
                                        float* nonfinite) {
  timed(count_label("unscale_gradients", count),
        [&] { inner_.unscale_gradients(count, scale, g, nonfinite); });
}

void ProfiledBackend::update_loss_scale(float* state, int64_t growth_steps) {
  timed("update_loss_scale", [&] { inner_.update_loss_scale(state, growth_steps); });
}

void ProfiledBackend::reorder_channels(int n, int c, int hw, Layout to, const float* x, float* y) {
  timed(fmt::format("reorder_channels to {} {}x{}x{}", to == Layout::kBlocked ? "blocked" : "plain",
                    n, c, hw),
        [&] { inner_.reorder_channels(n, c, hw, to, x, y); });
}

}  // namespace dtrain::nn
