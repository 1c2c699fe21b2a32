// `"model": {"keras": FILE}` (docs/train-config.md#keras-model-files): reads what Keras 3
// writes for a model (model.to_json(), a .keras archive's config.json, or the .keras archive
// itself) and translates a Sequential or Functional model of the classes dtrain has into
// dtrain's model graph. Keras's defaults hold where a key is absent; anything dtrain cannot
// honour is a ConfigError naming the file, the layer, its class and the key. Reads no weights
// (the archive's model.weights.h5 is never opened) and writes nothing (keras_archive.h writes
// the final model back in Keras's format).
#pragma once

#include <string>
#include <string_view>

#include "worker/spec/model_spec.h"

namespace dtrain::train {

/// A Keras model as dtrain's.
struct KerasModel {
  /// The translation: a train.model object as compact JSON (input_shape; layers named as in
  /// Keras, each with its type, inputs and keys; output). The architecture that checkpoints and
  /// model.json record.
  std::string model_json;
  nn::ModelSpec spec;  ///< model_json parsed (nn::parse_model_spec)
  /// The model's envelope as read ({"module", "class_name", "config", ...}), compact, without
  /// its compile_config (dtrain's train object says how it trains): model.keras's config.json.
  std::string keras_config;
};

/// Translates Keras's JSON text. ConfigError "<source>: layer \"conv2d_1\" (Conv2D): <key>: ..."
/// for a layer's mistake (shapes and cycles too, and a model whose weights have no Keras layout
/// dtrain can write: check_keras_layout), "<source>: <JSON path>: ..." for the rest.
KerasModel translate_keras_model(std::string_view json, const std::string& source);

/// Reads the file at path (a relative one from the working directory): Keras's JSON, or a zip
/// archive (a .keras file, told by its first bytes), whose config.json is translated. Messages
/// start "<path>: " ("<path>: config.json: " for what the archive's config.json says). Blocks on
/// file I/O; the whole file is read into memory, once.
KerasModel read_keras_model(const std::string& path);

}  // namespace dtrain::train
