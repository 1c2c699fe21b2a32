// The final model as a Keras 3 archive (docs/train-config.md#keras-model-files), for a model that
// came from Keras ({"keras": FILE}): RUN_DIR/model/model.keras, a zip of metadata.json,
// config.json (the model's Keras config as read) and model.weights.h5 (the weights in Keras's
// layout and groups, as keras/src/saving/saving_lib.py writes them), so that
// keras.saving.load_model opens it. No optimizer state (the model is saved uncompiled) and no
// reading back (dtrain resumes from its own checkpoints).
#pragma once

#include <ctime>
#include <string>
#include <vector>

#include "worker/spec/model_spec.h"
#include "worker/train/safetensors.h"

namespace dtrain::train {

/// Writes path (RUN_DIR/model/model.keras) in one atomic replacement: keras_config (a Keras
/// model envelope: {"module", "class_name": "Sequential" | "Functional", "config", ...}, as
/// KerasModel::keras_config) is config.json; spec is the model it was translated into; weights
/// are its parameters and state as the final model holds them (ModelTensors' names and
/// layouts). saved is metadata.json's date_saved and the members' time. Throws ConfigError or
/// IoError whose message starts with path; a failure leaves no file at path (nor an older one
/// changed). Blocks on disk I/O; holds the archive in memory.
void write_keras_archive(const std::string& path, const std::string& keras_config,
                         const nn::ModelSpec& spec, const std::vector<TensorView>& weights,
                         std::time_t saved);

}  // namespace dtrain::train
