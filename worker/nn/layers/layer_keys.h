// What the layer kinds of worker/nn/layers/ share: Keras's ways of writing sizes and
// activations, "same" padding, glorot_uniform, and a base for layers whose op a ReLU may follow
// (fused into the op's forward, undone in backward with the layer's own scratch). Not a layer.
#pragma once

#include <cstdint>
#include <utility>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/layer.h"
#include "worker/nn/layer_registry.h"

namespace dtrain::nn::layers {

/// Keras's int or [int, int] for sizes and strides, each in [min, max].
std::pair<int, int> int_or_pair(const common::JsonNode& node, int min, int max);
/// "relu", "softmax", "linear" (or null: linear).
Activation parse_activation(const common::JsonNode& node);
/// Keras's "same" padding for one dimension: {before, after} (TensorFlow's: the odd one after).
std::pair<int, int> same_padding(int in, int kernel, int stride);
/// Keras's glorot_uniform of a kernel with these fans, a pure function of seed.
void glorot_uniform(float* w, size_t count, int fan_in, int fan_out, uint64_t seed);

/// Keras's kernel initializers (VarianceScaling's named forms).
enum class Initializer {
  kGlorotUniform,
  kGlorotNormal,
  kHeNormal,
  kHeUniform,
  kLecunNormal,
  kLecunUniform
};
/// kernel_initializer: Keras's name ("he_normal") or its serialized object ({"class_name":
/// "HeNormal", "config": {"seed": ...}}; the seed is not used: dtrain draws from train.seed).
Initializer parse_initializer(const common::JsonNode& node);
/// The kernel's initial values, a pure function of seed: uniform in +-sqrt(3 scale / n), or a
/// normal of stddev sqrt(scale / n) / 0.87962566103423978 cut at two of its deviations (Keras's
/// truncated normal), with scale and n as Keras's VarianceScaling has them for the initializer.
void initialize_kernel(Initializer init, float* w, size_t count, int fan_in, int fan_out,
                       uint64_t seed);

/// A layer whose op may be followed by relu, fused into the op's forward; its gradient is applied
/// before the op's backward, into scratch of the layer's own.
class Activated : public Layer {
 protected:
  Activated(Activation activation, Dims out, const LayerContext& c);
  bool relu() const { return activation_ == Activation::kRelu; }
  /// dy through the activation: dy itself when linear (softmax is fused into the loss).
  const float* deactivate(Backend& b, int n, const float* y, const float* dy);
  float* scratch() { return delta_.data(); }
  Activation activation_;
  Dims out_;

 private:
  Buffer<float> delta_;
};

}  // namespace dtrain::nn::layers
