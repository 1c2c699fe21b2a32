// train.callbacks as the job writes them (docs/design.md#callbacks): Keras's EarlyStopping,
// ModelCheckpoint(save_best_only) and ReduceLROnPlateau with their keys and defaults, and what a
// monitor watches. Parsing only; worker/train/callbacks.h runs them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/json.h"

namespace dtrain::train {

/// Keras's MonitorCallback: what is watched and which way is better.
struct MonitorSpec {
  std::string monitor = "val_loss";  ///< loss, accuracy, val_loss or val_accuracy
  bool maximize = false;             ///< mode "max" (or "auto" for accuracy); else "min"
  double min_delta = 0;              ///< an improvement must beat the best by more than this
  std::optional<double> baseline;    ///< the value to beat first (ModelCheckpoint's
                                     ///< initial_value_threshold)
  /// value improves on reference (beyond min_delta, in the mode's direction).
  bool improves(double value, double reference) const;
};

/// train.callbacks' EarlyStopping, with Keras's keys and defaults.
struct EarlyStoppingSpec {
  MonitorSpec watch;
  int patience = 0;  ///< epochs without improvement before stopping
  bool restore_best_weights = false;
  int start_from_epoch = 0;  ///< epochs (0-based) before which nothing is judged
};

/// train.callbacks' ModelCheckpoint with save_best_only: the model of each epoch that improves
/// on the best so far goes to RUN_DIR/model/best/.
struct ModelCheckpointSpec {
  MonitorSpec watch;
};

/// train.callbacks' ReduceLROnPlateau, with Keras's keys and defaults (min_delta 1e-4).
struct ReduceLrSpec {
  MonitorSpec watch;
  double factor = 0.1;  ///< the rate is multiplied by it (below 1)
  int patience = 10;
  int cooldown = 0;  ///< epochs after a reduction in which the wait does not count
  double min_lr = 0;
};

struct CallbackSpecs {
  std::optional<EarlyStoppingSpec> early_stopping;
  std::optional<ModelCheckpointSpec> model_checkpoint;
  std::optional<ReduceLrSpec> reduce_lr;
};

/// Parses train.callbacks: a list of {"class_name": NAME, "config": {...}} (Keras's serialized
/// form) or {"type": NAME, keys...}. EarlyStopping and ModelCheckpoint (save_best_only) are taken;
/// TerminateOnNaN is always on (dtrain checks every step) and takes no keys; any other callback
/// is a ConfigError naming it. validation: train.validation, which a val_ monitor needs.
CallbackSpecs parse_callbacks(const common::JsonNode& node, bool validation,
                              const std::vector<std::string>& logged);

}  // namespace dtrain::train
