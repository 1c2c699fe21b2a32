// The kinds of layer dtrain has, by the names a job file gives them ("conv2d") and the Keras
// class each stands for ("Conv2D"). Each kind's keys, defaults, shape rules and construction live
// in its own file of worker/nn/layers/; this table is the one list of them (the recipe for a new
// kind: docs/design.md#adding-a-layer).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/json.h"
#include "worker/nn/layer.h"

namespace dtrain::nn {

struct LayerKind {
  const char* type;         ///< the job file's "type": "conv2d"
  const char* keras_class;  ///< Keras's class_name: "Conv2D"
  /// Parses the layer object's keys (its "type", "name" and "inputs" are the model's and are
  /// allowed); ConfigError naming the JSON path for anything wrong.
  std::unique_ptr<LayerConfig> (*parse)(const common::JsonNode& node);
  /// True once its operations' parity with the reference passed on a GPU: a GPU job with a
  /// kind that has not is refused (exit 2) rather than run untested.
  bool gpu_tested;
};

/// The kind of this type name, or null.
const LayerKind* find_layer_kind(std::string_view type);
/// The known type a typo most likely meant (at most two edits away), or "".
std::string closest_layer_type(std::string_view typo);
/// "conv2d, max_pooling2d, ... or relu", for messages.
std::string layer_type_list();

}  // namespace dtrain::nn
