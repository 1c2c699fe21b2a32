// The kinds of layer dtrain has, by the names a job file gives them ("conv2d") and the Keras
// class each stands for ("Conv2D"). Each kind's keys, defaults and shape rules live in its own
// files of worker/spec/layers/ (the layer that runs in worker/nn/layers/, built through
// worker/nn/layer_builders.cc); this table is the one list of them (the recipe for a new kind:
// docs/design.md#adding-a-layer), with how each kind's Keras config keys are read from Keras's
// model files (worker/spec/keras_model.*, which reads them; the kinds only say how).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"

namespace dtrain::nn {

/// How a key of a Keras layer's config (beyond Layer's own: name, trainable, dtype,
/// activity_regularizer) is taken when a Keras model file is read. A key a kind does not list
/// is refused there, as is a value its KerasKey does not allow.
enum class KerasKey {
  kRead,           ///< passed under its own name to the kind's parse, which reads it
  kActivation,     ///< passed on: linear, relu, softmax, sigmoid, tanh, gelu, silu (null: linear)
  kNull,           ///< only null (regularizers, constraints, LoRA, quantization, ReLU's max)
  kOne,            ///< only 1 or [1, 1] (dilation_rate, groups)
  kZero,           ///< only 0 (ReLU's negative_slope, threshold)
  kChannelsLast,   ///< only "channels_last" or null (data_format)
  kGlorotUniform,  ///< only Keras's GlorotUniform (kernel_initializer), with any seed
  kZeros,          ///< only Keras's Zeros (bias_initializer)
  kSeed,           ///< any integer or null, not used: dtrain draws from train.seed
  kOnes,           ///< only Keras's Ones (gamma_initializer, moving_variance_initializer)
  kFalse,          ///< only false (BatchNormalization's renorm)
  kUnusedNumber,   ///< any number, not used (renorm_momentum, with renorm false)
  /// a kernel initializer: passed on as its class name ("HeNormal"), left out when it is the
  /// default GlorotUniform; the kind's parse checks it (its seed is not used)
  kInitializer,
  /// a regularizer: passed on when not null (the kind's parse checks it), so a file without
  /// one translates as it did before dtrain read them
  kRegularizer,
  /// only null or [1]: MultiHeadAttention's attention_axes, which Keras writes as the sequence's
  /// axis once the layer is built
  kSequenceAxis,
};

/// One Keras config key of a kind and how it is taken.
struct KerasKeySpec {
  const char* key;  ///< Keras's name: "dilation_rate"
  KerasKey how;
};

/// How an argument of a Keras layer's call besides its inputs (the first) is taken when a
/// Functional's inbound node ({"args": [...], "kwargs": {...}}) is read. One a kind does not
/// list, or at a value its KerasArg does not allow, is refused there naming it.
enum class KerasArg {
  kSameTensor,  ///< a tensor, only the one the layer is called on (self-attention's value, key)
  kNull,        ///< only null (masks, training)
  kFalse,       ///< only false (return_attention_scores)
  kFlag,        ///< true or false, passed under its own name to the kind's parse
};

/// One argument of a kind's Keras call and how it is taken.
struct KerasArgSpec {
  const char* name;  ///< the call's parameter: "use_causal_mask"
  KerasArg how;
};

struct LayerKind {
  const char* type;         ///< the job file's "type": "conv2d"
  const char* keras_class;  ///< Keras's class_name: "Conv2D"
  /// Parses the layer object's keys (its "type", "name" and "inputs" are the model's and are
  /// allowed); ConfigError naming the JSON path for anything wrong.
  std::unique_ptr<LayerConfig> (*parse)(const common::JsonNode& node);
  /// The keys of keras_class's get_config() beyond Layer's own, each with how it is taken.
  std::vector<KerasKeySpec> (*keras_keys)();
  /// True once its operations' parity with the reference passed on a GPU: a GPU job with a
  /// kind that has not is refused (exit 2) rather than run untested.
  bool gpu_tested;
  /// Whose class keras_class is: "keras", or "keras_hub" (a file names it by the module
  /// keras_hub.<...> and the registered_name "keras_hub>Class").
  const char* keras_package = "keras";
  /// The arguments of keras_class's call after its inputs, in the call's order (a positional
  /// argument takes the next one). Null: the inputs only, with mask and training null.
  std::vector<KerasArgSpec> (*keras_call)() = nullptr;
};

/// The kind of this type name, or null.
const LayerKind* find_layer_kind(std::string_view type);
/// The known type a typo most likely meant (at most two edits away), or "".
std::string closest_layer_type(std::string_view typo);
/// Every kind, in the table's order (for tests that each has what it needs elsewhere).
std::vector<const LayerKind*> layer_kinds();
/// "conv2d, max_pooling2d, ... or relu", for messages.
std::string layer_type_list();
/// The kind that stands for this Keras class_name ("Conv2D"), or null.
const LayerKind* find_keras_class(std::string_view keras_class);
/// "Conv2D, MaxPooling2D, ... and Add", for messages.
std::string keras_class_list();

}  // namespace dtrain::nn
