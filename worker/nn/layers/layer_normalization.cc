// Keras's LayerNormalization on the last axis (docs/design.md#sequences): each position of a
// sequence (its w features), or a flat input's features, normalized by its own mean and biased
// variance; epsilon 1e-3, center (beta), scale (gamma), Keras's defaults. The same in training
// and inference: no state. The mean and 1 / sqrt(var + epsilon) of each row its forward
// computed are kept in the layer's own scratch for the backward. rms_scaling, other axes and
// images are not here.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

struct LayerNormKeys {
  int axis = -1;  ///< -1, or the last axis's index in Keras's shape (checked against the input)
  float epsilon = 1e-3f;
  bool center = true, scale = true;
};

/// The features of each normalized row, and the rows per example.
int features_of(const Dims& in) {
  return in.sequence ? in.w : static_cast<int>(in.size());
}

class LayerNormalization : public Layer {
 public:
  LayerNormalization(const LayerNormKeys& k, Dims in, const LayerContext& c)
      : k_(k),
        features_(features_of(in)),
        positions_(in.positions()),
        max_rows_(static_cast<size_t>(c.max_batch) * in.positions()),
        saved_(c.backend.device(), 2 * max_rows_) {}
  std::vector<ParamInfo> params() const override {
    std::vector<ParamInfo> out;
    const size_t f = static_cast<size_t>(features_);
    if (k_.scale) out.push_back({"gamma", {features_}, 0, f});
    if (k_.center) out.push_back({"beta", {features_}, k_.scale ? f : 0, f});
    return out;
  }
  void initialize(float* p, float*, uint64_t) const override {
    const size_t f = static_cast<size_t>(features_);
    if (k_.scale) std::fill(p, p + f, 1.0f);
    if (k_.center) std::fill(p + (k_.scale ? f : 0), p + (k_.scale ? 2 * f : f), 0.0f);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    b.layernorm_forward(a.n * positions_, features_, k_.epsilon, a.x[0], gamma(a.params),
                        beta(a.params), a.y, saved_.data(), saved_.data() + max_rows_);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    float* dgamma = k_.scale ? a.grads : nullptr;
    float* dbeta = k_.center ? a.grads + (k_.scale ? features_ : 0) : nullptr;
    b.layernorm_backward(a.n * positions_, features_, a.x[0], a.dy, gamma(a.params), saved_.data(),
                         saved_.data() + max_rows_, a.dx[0], dgamma, dbeta);
    if (enqueued && (k_.scale || k_.center)) enqueued(0);
  }

 private:
  const float* gamma(const float* p) const { return k_.scale ? p : nullptr; }
  const float* beta(const float* p) const {
    return k_.center ? p + (k_.scale ? features_ : 0) : nullptr;
  }
  LayerNormKeys k_;
  int features_, positions_;
  size_t max_rows_;
  Buffer<float> saved_;  ///< the last forward's mean (max_rows_), then its rstd (max_rows_)
};

class LayerNormConfig : public LayerConfig {
 public:
  explicit LayerNormConfig(const LayerNormKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    const Dims& x = in[0];
    if (!x.sequence && !x.flat()) {
      throw common::ConfigError(fmt::format(
          "{}: layer_normalization takes a sequence or flat features, not a {}x{}x{} image", where,
          x.h, x.w, x.c));
    }
    const int last = x.sequence ? 2 : 1;  // Keras's shape: (batch, T, D) or (batch, features)
    if (k_.axis != -1 && k_.axis != last) {
      throw common::ConfigError(fmt::format(
          "{}: axis {} is not supported (dtrain normalizes the last axis: -1, or {} here)", where,
          k_.axis, last));
    }
    return x;
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<LayerNormalization>(k_, in[0], c);
  }

 private:
  LayerNormKeys k_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_layer_normalization(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "axis", "epsilon", "center", "scale", "rms_scaling"});
  LayerNormKeys k;
  if (auto n = node.find("axis")) {
    // Keras writes the axes it built with as a list of positive indices ([2] for (T, D)).
    if (n->is_array() && n->as_array().size() != 1)
      n->fail("only one axis is supported (the last: -1)");
    const common::JsonNode axis = n->is_array() ? n->as_array()[0] : *n;
    k.axis = static_cast<int>(axis.as_int(-8, 8));
    if (k.axis != -1 && k.axis < 1)
      n->fail(
          fmt::format("axis {} is not supported (dtrain normalizes the last axis: -1)", k.axis));
  }
  if (auto n = node.find("epsilon")) k.epsilon = static_cast<float>(n->as_number(1e-12, 1.0));
  if (auto n = node.find("center")) k.center = n->as_bool();
  if (auto n = node.find("scale")) k.scale = n->as_bool();
  if (auto n = node.find("rms_scaling"); n && n->as_bool())
    n->fail("true is not supported (Keras deprecates it for RMSNormalization): false");
  return std::make_unique<LayerNormConfig>(k);
}

// Keras's LayerNormalization.get_config() (keras/src/layers/normalization/
// layer_normalization.py): the initializers at Keras's defaults, no regularizers or constraints.
std::vector<KerasKeySpec> keras_keys_layer_normalization() {
  return {{"axis", KerasKey::kRead},
          {"epsilon", KerasKey::kRead},
          {"center", KerasKey::kRead},
          {"scale", KerasKey::kRead},
          {"rms_scaling", KerasKey::kRead},
          {"beta_initializer", KerasKey::kZeros},
          {"gamma_initializer", KerasKey::kOnes},
          {"beta_regularizer", KerasKey::kNull},
          {"gamma_regularizer", KerasKey::kNull},
          {"beta_constraint", KerasKey::kNull},
          {"gamma_constraint", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
