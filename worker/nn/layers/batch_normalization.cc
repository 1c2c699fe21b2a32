// Keras's BatchNormalization on the channels (axis -1 of NHWC: C of dtrain's NCHW; a flat input's
// features): momentum 0.99, epsilon 1e-3, center (beta), scale (gamma). Training normalizes by
// the batch's own mean and biased variance and hands them to the step as statistics; the step
// sums them over the virtual shards in shard order and update_state moves the moving mean and
// variance by Keras's rule, with the shards' mean (docs/design.md#batch-normalization).
// Inference normalizes by the moving statistics. A ReLU that is its only user runs inside it
// (fuse_relu), and so does an add that is (fuse_add: a residual block's end, with that add's
// ReLU). synchronized: in a group's training step the statistics, and backward's sums, are
// the whole global batch's, summed over the workers
// (docs/design.md#synchronized-batch-normalization).
// Its keys and shape rules: worker/spec/layers/batch_normalization.h.
#include "worker/spec/layers/batch_normalization.h"

#include <algorithm>

#include "common/errors.h"
#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class BatchNormalization : public Layer {
 public:
  BatchNormalization(const NormKeys& k, Dims in, const LayerContext& c)
      : k_(k),
        in_(in),
        saved_(c.backend.device(), 2 * static_cast<size_t>(in.c)),
        sums_(k.synchronized ? 2 * static_cast<size_t>(in.c) + 1 : 0) {}
  std::vector<ParamInfo> params() const override {
    std::vector<ParamInfo> out;
    const size_t c = channels();
    if (k_.scale) out.push_back({"gamma", {in_.c}, 0, c});
    if (k_.center) out.push_back({"beta", {in_.c}, k_.scale ? c : 0, c});
    return out;
  }
  std::vector<ParamInfo> state() const override {
    const size_t c = channels();
    return {{"moving_mean", {in_.c}, 0, c}, {"moving_variance", {in_.c}, c, c}};
  }
  size_t statistics_count() const override { return 2 * channels(); }
  bool fuse_relu() override { return relu_ = true; }
  /// A residual block's add after it, in its output pass (not synchronized, nor with a ReLU of
  /// its own: its output's only user is the add).
  bool fuse_add(bool relu) override {
    if (k_.synchronized || relu_) return false;
    add_relu_ = relu;
    return add_ = true;
  }
  /// Its training and inference passes take blocked channels; the synchronized pieces do not.
  Blocking blocking() const override {
    return k_.synchronized ? Blocking::kNone : Blocking::kFollows;
  }
  void set_layouts(const std::vector<Layout>& /*in*/, Layout out) override { layout_ = out; }
  /// Its training passes write them (the synchronized pieces do not).
  bool writes_rounded() const override { return !k_.synchronized && layout_ == Layout::kBlocked; }
  void initialize(float* p, float* state, uint64_t) const override {
    const size_t c = channels();
    if (k_.scale) std::fill(p, p + c, 1.0f);
    if (k_.center) std::fill(p + (k_.scale ? c : 0), p + (k_.scale ? 2 * c : c), 0.0f);
    std::fill(state, state + c, 0.0f);
    std::fill(state + c, state + 2 * c, 1.0f);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    training_ = a.training;
    y_unwritten_ = false;
    DT_ENFORCE(!add_ || a.addend, "batch normalization took an add in but got no addend");
    if (!a.training) {
      if (add_)
        b.batchnorm_add_forward_inference(at(a.n), k_.epsilon, a.x[0], gamma(a.params),
                                          beta(a.params), a.state, a.state + channels(), a.addend,
                                          add_relu_, a.y);
      else
        b.batchnorm_forward_inference(at(a.n), k_.epsilon, a.x[0], gamma(a.params), beta(a.params),
                                      a.state, a.state + channels(), a.y);
      return;
    }
    float* mean = saved_.data();
    float* var = mean + channels();
    if (k_.synchronized && a.group) {
      forward_grouped(b, a, mean, var);
      return;
    }
    NormShape s = at(a.n);
    s.rounded = a.y_rounded;
    // y left unwritten where only its copy is read: not a sum taken in (the backward's ReLU
    // mask would read it), and then the backward takes no y.
    s.rounded_only = s.rounded && a.y_rounded_only && !add_;
    y_unwritten_ = s.rounded_only;
    if (add_)
      b.batchnorm_add_forward_training(s, k_.epsilon, a.x[0], gamma(a.params), beta(a.params),
                                       a.addend, add_relu_, a.y, mean, var);
    else
      b.batchnorm_forward_training(s, k_.epsilon, a.x[0], gamma(a.params), beta(a.params), a.y,
                                   mean, var);
    if (a.statistics) b.device().copy(a.statistics, mean, 2 * channels() * sizeof(float));
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    DT_ENFORCE(training_, "batch normalization's backward after an inference forward");
    const float* mean = saved_.data();
    float* dgamma = k_.scale ? a.grads : nullptr;
    float* dbeta = k_.center ? a.grads + (k_.scale ? channels() : 0) : nullptr;
    if (k_.synchronized && a.group) {  // the model hands backward its forward's group
      backward_grouped(b, a, enqueued, dgamma, dbeta);
      return;
    }
    NormShape s = at(a.n);
    s.rounded = a.dx[0] ? a.dx_rounded : nullptr;
    s.rounded_only = s.rounded && a.dx_rounded_only;
    b.batchnorm_backward(s, k_.epsilon, a.x[0], y_unwritten_ ? nullptr : a.y, a.dy, gamma(a.params),
                         mean, mean + channels(), a.dx[0], dgamma, dbeta);
    if (enqueued && (k_.scale || k_.center)) enqueued(0);
  }
  void update_state(Backend& b, const float* summed, int shards, float* state) override {
    b.moving_average_update(2 * channels(), k_.momentum, shards, summed, state);
  }

 private:
  // The global batch's mean, then its variance about that mean (two passes, as the per-batch
  // forward), each from every worker's per-channel sums; then the normalization by them.
  void forward_grouped(Backend& b, const ForwardArgs& a, float* mean, float* var) {
    DT_ENFORCE(b.device().kind() == DeviceKind::kHost,
               "synchronized batch normalization runs on the host only");
    const size_t c = channels();
    float* sums = sums_.data();
    b.batchnorm_sums(at(a.n), a.x[0], nullptr, sums);
    sums[c] = static_cast<float>(a.n);  // the examples, exact as a float up to 2^24
    (*a.group)(sums, c + 1);
    count_ = static_cast<double>(sums[c]) * in_.h * in_.w;
    for (size_t ch = 0; ch < c; ++ch) mean[ch] = static_cast<float>(sums[ch] / count_);
    b.batchnorm_sums(at(a.n), a.x[0], mean, sums);
    (*a.group)(sums, c);
    for (size_t ch = 0; ch < c; ++ch) var[ch] = static_cast<float>(sums[ch] / count_);
    b.batchnorm_forward_inference(at(a.n), k_.epsilon, a.x[0], gamma(a.params), beta(a.params),
                                  mean, var, a.y);
    if (a.statistics) b.device().copy(a.statistics, mean, 2 * c * sizeof(float));
  }
  // This batch's sums of dy and dy * xhat are its gradients (the step all-reduces those with the
  // others); dx takes them summed over every worker's batch, as SyncBatchNorm's backward.
  void backward_grouped(Backend& b, const BackwardArgs& a,
                        const std::function<void(size_t)>& enqueued, float* dgamma, float* dbeta) {
    const size_t c = channels();
    const float* mean = saved_.data();
    float* totals = sums_.data();
    b.batchnorm_backward(at(a.n), k_.epsilon, a.x[0], a.y, a.dy, gamma(a.params), mean, mean + c,
                         nullptr, totals + c, totals);
    if (dgamma) std::copy(totals + c, totals + 2 * c, dgamma);
    if (dbeta) std::copy(totals, totals + c, dbeta);
    if (enqueued && (k_.scale || k_.center)) enqueued(0);
    if (!a.dx[0]) return;
    (*a.group)(totals, 2 * c);
    b.batchnorm_backward_data(at(a.n), k_.epsilon, a.x[0], a.y, a.dy, gamma(a.params), mean,
                              mean + c, totals, count_, a.dx[0]);
  }

  size_t channels() const { return static_cast<size_t>(in_.c); }
  NormShape at(int n) const { return {n, in_.c, in_.h * in_.w, relu_, layout_}; }
  const float* gamma(const float* p) const { return k_.scale ? p : nullptr; }
  const float* beta(const float* p) const {
    return k_.center ? p + (k_.scale ? channels() : 0) : nullptr;
  }
  NormKeys k_;
  Dims in_;
  Buffer<float> saved_;  ///< the last training batch's mean and variance, for backward
  /// synchronized: the per-channel sums handed to the group (host memory), and the values per
  /// channel of the last grouped forward's global batch.
  std::vector<float> sums_;
  double count_ = 0;
  bool training_ = false;
  bool y_unwritten_ = false;  ///< the last training forward wrote only y's copy
  bool relu_ = false;         ///< a ReLU fused after it
  bool add_ = false;          ///< an add taken in after it (fuse_add): y is the add's output
  bool add_relu_ = false;     ///< and that add's fused ReLU
  Layout layout_ = Layout::kPlain;
};

}  // namespace

std::unique_ptr<Layer> make_batch_normalization(const LayerConfig& config,
                                                const std::vector<Dims>& in,
                                                const LayerContext& c) {
  const NormKeys& k = static_cast<const BatchNormalizationConfig&>(config).keys();
  return std::make_unique<BatchNormalization>(k, in[0], c);
}

}  // namespace dtrain::nn::layers
