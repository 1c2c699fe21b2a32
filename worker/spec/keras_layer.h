// One layer of a Keras 3 model file (docs/train-config.md#keras-model-files): its envelope
// ({"module", "class_name", "config", "registered_name"}) and its config, checked key by key
// against what dtrain computes and turned into the keys of a dtrain layer object. Which keys a
// kind has, and how each is taken, is the kind's (nn::LayerKind::keras_keys); this file applies
// them. Knows nothing of the model's graph or of files (keras_model.cc). Errors are ConfigErrors
// "<JSON path of the key>: ..." for the caller to name the layer.
#pragma once

#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_registry.h"

namespace dtrain::train::keras {

/// Keras's own class, or keras_hub's: module "keras", "keras.<...>", "keras_hub" or
/// "keras_hub.<...>", registered_name null, the class name or "keras_hub>" and the class name
/// (any other registered custom class is refused). Returns class_name. Other keys are the
/// caller's.
std::string check_keras_class(const common::JsonNode& envelope);

/// Whose class a checked envelope names (nn::LayerKind::keras_package): "keras_hub" when its
/// module or registered_name is keras_hub's, "keras" when its module is Keras's, "" when it
/// says neither (no module: a hand-written file).
std::string keras_package(const common::JsonNode& envelope);

/// A dtype (Layer's, a model's or a tensor's) that is float32: "float32", null, or a DTypePolicy
/// (or FloatDTypePolicy) object named float32. Anything else is refused (mixed precision is
/// train.dtype_policy).
void check_dtype(const common::JsonNode& value);

/// Writes a Keras layer config's keys, as dtrain's kind takes them, into w (inside the layer's
/// object, after its name, type and inputs): Layer's own keys (trainable true, dtype float32,
/// activity_regularizer null) are checked and not written, "name" is the caller's; each other
/// key must be one kind.keras_keys() lists, at a value its KerasKey allows.
void write_layer_keys(const common::JsonNode& config, const nn::LayerKind& kind,
                      common::JsonWriter& w);

/// An InputLayer's config checked (float32, not sparse, ragged or optional, no fixed batch
/// size): its batch_shape without the batch, [h, w, c] ([h, w] is read as [h, w, 1]), or [T]
/// for [null, T]: a sequence of token ids (dtrain's input_shape [T]), whose dtype may also be
/// int32 or int64 (the ids travel as floats).
std::vector<int> input_layer_shape(const common::JsonNode& config);

/// A batch_shape ([null, h, w, c] or [null, h, w]) as [h, w, c], or [null, T] as [T]: every
/// size but the batch fixed.
std::vector<int> batch_shape(const common::JsonNode& value);

/// Whether a dtype is an integer one token ids may have: "int32" or "int64" (or a DTypePolicy
/// of that name).
bool is_token_dtype(const common::JsonNode& value);

}  // namespace dtrain::train::keras
