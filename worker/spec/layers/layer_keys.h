// What the layer kinds' keys share (worker/spec/layers/): Keras's ways of writing sizes,
// activations, pooling keys, regularizers and initializers, "same" padding, and the refusal of a
// sequence where a kind reads images. Parsing and shape rules only; what the built layers share
// (initializers' draws, an activation after an op) is worker/nn/layers/layer_parts.h's.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"

namespace dtrain::nn::layers {

/// ConfigError "<where>: <type> does not take a sequence ..." when an input is one
/// (docs/design.md#sequences): for the kinds that read their input as an image (or as channels).
void refuse_sequence(const std::vector<Dims>& in, const std::string& where, const char* type);
/// Keras's int or [int, int] for sizes and strides, each in [min, max].
std::pair<int, int> int_or_pair(const common::JsonNode& node, int min, int max);
/// Keras's names: "linear" (or null), "relu", "softmax", "sigmoid", "tanh", "gelu" (the erf
/// form, Keras's default), "silu" or "swish".
Activation parse_activation(const common::JsonNode& node);
/// The backend's elementwise op of an activation computed by eltwise_forward; false for linear,
/// relu and softmax.
bool eltwise_of(Activation activation, Eltwise* f);
/// Keras's "same" padding for one dimension: {before, after} (TensorFlow's: the odd one after).
std::pair<int, int> same_padding(int in, int kernel, int stride);
/// Keras's pooling keys (MaxPooling2D, AveragePooling2D): pool_size, strides (null or absent:
/// pool_size), padding "valid" or "same" (TensorFlow's: the odd pixel after).
struct PoolKeys {
  int pool_h = 2, pool_w = 2;
  int stride_h = 2, stride_w = 2;
  bool same = false;
};
/// Reads pool_size (required when pool_size_required, else Keras's default 2), strides and
/// padding; ConfigError naming the key's path for anything wrong.
PoolKeys parse_pool_keys(const common::JsonNode& node, bool pool_size_required);
/// The output size of pooling with these keys; ConfigError "<where>: ..." when a "valid" window
/// does not fit.
Dims pool_output_dims(const PoolKeys& k, const Dims& in, const std::string& where);

/// Keras's L1, L2 and L1L2 regularizers as (l1, l2) factors.
struct Regularizer {
  float l1 = 0, l2 = 0;
};
/// kernel_regularizer or bias_regularizer: null (none), Keras's name ("l1", "l2", "l1_l2", or
/// the class's) with its defaults, or its serialized object ({"class_name": "L2", "config":
/// {"l2": 0.01}}); factors are non-negative and finite. Any other class (OrthogonalRegularizer,
/// a custom one) is a ConfigError naming the key.
Regularizer parse_regularizer(const common::JsonNode& node);

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

/// Keras's RandomUniform, the embeddings' initializer: [minval, maxval), by default Keras's
/// "uniform" (-0.05, 0.05).
struct UniformRange {
  float minval = -0.05f, maxval = 0.05f;
};
/// embeddings_initializer: "uniform" (or "random_uniform", "RandomUniform"), or Keras's
/// serialized RandomUniform with minval < maxval and any seed (dtrain draws from train.seed);
/// anything else a ConfigError naming the key.
UniformRange parse_uniform_initializer(const common::JsonNode& node);

}  // namespace dtrain::nn::layers
