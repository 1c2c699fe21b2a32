// Keras's EarlyStopping (train.callbacks; docs/design.md#callbacks): at each epoch's end the
// monitored metric, the same on every worker (the epoch's totals and the validation are reduced
// over the group), decides on every worker alike whether training stops. Its state (the best
// value, the wait, the best epoch, the epoch it stopped at, and with restore_best_weights a copy
// of the best weights) is a set of host tensors that ModelTensors carries with the model's, so
// checkpoints, recovery in place and the final state keep it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/train/model_tensors.h"
#include "worker/train/safetensors.h"

namespace dtrain::train {

/// train.callbacks' EarlyStopping, with Keras's keys and defaults.
struct EarlyStoppingSpec {
  std::string monitor = "val_loss";  ///< loss, accuracy, val_loss or val_accuracy
  double min_delta = 0;              ///< an improvement must beat the best by more than this
  int patience = 0;                  ///< epochs without improvement before stopping
  bool maximize = false;             ///< mode "max" (or "auto" for accuracy); else "min"
  std::optional<double> baseline;    ///< the value to beat first
  bool restore_best_weights = false;
  int start_from_epoch = 0;  ///< epochs (0-based) before which nothing is judged
};

/// Parses train.callbacks: a list of {"class_name": NAME, "config": {...}} (Keras's serialized
/// form) or {"type": NAME, keys...}. EarlyStopping is taken; TerminateOnNaN is always on (dtrain
/// checks every step) and takes no keys; any other callback is a ConfigError naming it.
/// validation: train.validation, which a val_ monitor needs.
std::optional<EarlyStoppingSpec> parse_callbacks(const common::JsonNode& node, bool validation);

class EarlyStopping {
 public:
  /// weights: the model's weight tensors (names and shapes), for the best copy.
  EarlyStopping(EarlyStoppingSpec spec, const std::vector<TensorView>& weights);

  /// Keras's on_epoch_end for epoch (0-based) with the epoch's metrics by name; weights: the
  /// current weights (views as `weights` above), copied when they are the best. Returns true
  /// when training is to stop after this epoch.
  bool on_epoch_end(int epoch, const std::vector<std::pair<std::string, double>>& metrics,
                    const std::vector<TensorView>& weights);
  /// True once an epoch's end decided to stop (also after a resume from that epoch's checkpoint).
  bool stopped() const;
  /// The epoch (1-based) that stopped training, 0 when none did.
  int stopped_epoch() const;
  /// With restore_best_weights, once a best was seen: copies it into weights (views of host
  /// memory the caller uploads) and returns the best epoch (1-based); else 0.
  int restore_best(const std::vector<TensorView>& weights) const;
  /// Its state as host tensors, for ModelTensors.
  std::vector<HostTensor> tensors();

 private:
  bool improves(double value, double reference) const;
  EarlyStoppingSpec spec_;
  /// has_best, best (a double's bits in two floats), wait, best_epoch, stopped_epoch (1-based,
  /// 0: none), has_best_weights: all zero for a fresh state, as a checkpoint without it loads.
  std::vector<float> state_;
  std::vector<std::vector<float>> best_;  ///< restore_best_weights: one per weight tensor
  std::vector<TensorView> shapes_;        ///< the weights' names and shapes (no data)
};

}  // namespace dtrain::train
