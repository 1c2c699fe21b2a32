// Keras's BatchNormalization on the channels (axis -1 of NHWC: C of dtrain's NCHW; a flat input's
// features): momentum 0.99, epsilon 1e-3, center (beta), scale (gamma). Training normalizes by
// the batch's own mean and biased variance and hands them to the step as statistics; the step
// sums them over the virtual shards in shard order and update_state moves the moving mean and
// variance by Keras's rule, with the shards' mean (docs/design.md#batch-normalization).
// Inference normalizes by the moving statistics. A ReLU that is its only user runs inside it
// (fuse_relu). synchronized: in a group's training step the statistics, and backward's sums, are
// the whole global batch's, summed over the workers
// (docs/design.md#synchronized-batch-normalization).
#include <fmt/format.h>

#include <algorithm>

#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

struct NormKeys {
  float momentum = 0.99f;
  float epsilon = 1e-3f;
  bool center = true, scale = true;
  bool synchronized = false;
};

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
  void initialize(float* p, float* state, uint64_t) const override {
    const size_t c = channels();
    if (k_.scale) std::fill(p, p + c, 1.0f);
    if (k_.center) std::fill(p + (k_.scale ? c : 0), p + (k_.scale ? 2 * c : c), 0.0f);
    std::fill(state, state + c, 0.0f);
    std::fill(state + c, state + 2 * c, 1.0f);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    training_ = a.training;
    if (!a.training) {
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
    b.batchnorm_forward_training(at(a.n), k_.epsilon, a.x[0], gamma(a.params), beta(a.params), a.y,
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
    b.batchnorm_backward(at(a.n), k_.epsilon, a.x[0], a.y, a.dy, gamma(a.params), mean,
                         mean + channels(), a.dx[0], dgamma, dbeta);
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
  NormShape at(int n) const { return {n, in_.c, in_.h * in_.w, relu_}; }
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
  bool relu_ = false;  ///< a ReLU fused after it
};

class NormConfig : public LayerConfig {
 public:
  explicit NormConfig(const NormKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "batch_normalization");
    return in[0];
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<BatchNormalization>(k_, in[0], c);
  }
  bool sums_over_group() const override { return k_.synchronized; }

 private:
  NormKeys k_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_batch_normalization(const common::JsonNode& node) {
  node.check_keys(
      {"type", "name", "inputs", "axis", "momentum", "epsilon", "center", "scale", "synchronized"});
  NormKeys k;
  if (auto n = node.find("axis")) {
    int64_t axis = n->is_array() && n->as_array().size() == 1 ? n->as_array()[0].as_int(-4, 3)
                                                              : n->as_int(-4, 3);
    if (axis != -1 && axis != 3)
      n->fail(fmt::format("axis {} is not supported (the channels: -1, or 3 of NHWC)", axis));
  }
  if (auto n = node.find("momentum")) k.momentum = static_cast<float>(n->as_number(0.0, 1.0));
  if (auto n = node.find("epsilon")) k.epsilon = static_cast<float>(n->as_number(1e-12, 1.0));
  if (auto n = node.find("center")) k.center = n->as_bool();
  if (auto n = node.find("scale")) k.scale = n->as_bool();
  if (auto n = node.find("synchronized")) k.synchronized = n->as_bool();
  return std::make_unique<NormConfig>(k);
}

// Keras's BatchNormalization.get_config(): the initializers at Keras's defaults, no regularizers
// or constraints, renorm off.
std::vector<KerasKeySpec> keras_keys_batch_normalization() {
  return {{"axis", KerasKey::kRead},
          {"momentum", KerasKey::kRead},
          {"epsilon", KerasKey::kRead},
          {"center", KerasKey::kRead},
          {"scale", KerasKey::kRead},
          {"beta_initializer", KerasKey::kZeros},
          {"gamma_initializer", KerasKey::kOnes},
          {"moving_mean_initializer", KerasKey::kZeros},
          {"moving_variance_initializer", KerasKey::kOnes},
          {"beta_regularizer", KerasKey::kNull},
          {"gamma_regularizer", KerasKey::kNull},
          {"beta_constraint", KerasKey::kNull},
          {"gamma_constraint", KerasKey::kNull},
          {"synchronized", KerasKey::kRead},
          {"renorm", KerasKey::kFalse},
          {"renorm_clipping", KerasKey::kNull},
          {"renorm_momentum", KerasKey::kUnusedNumber}};
}

}  // namespace dtrain::nn::layers
