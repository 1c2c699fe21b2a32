// Keras's callbacks (train.callbacks; docs/design.md#callbacks): EarlyStopping,
// ModelCheckpoint(save_best_only) and ReduceLROnPlateau. At each epoch's end the monitored metric,
// the same on every worker (the epoch's totals and the validation are reduced over the group),
// decides on every worker alike. Each callback's state (the best value, the wait, ..., and
// EarlyStopping's copy of the best weights) is a set of host tensors that ModelTensors carries with
// the model's, so checkpoints, recovery in place and the final state keep it.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/spec/callback_specs.h"
#include "worker/train/model_tensors.h"
#include "worker/train/safetensors.h"

namespace dtrain::train {

/// The epoch's metrics by name (loss, accuracy, and val_loss, val_accuracy when validated).
using NamedMetrics = std::vector<std::pair<std::string, double>>;

class EarlyStopping {
 public:
  /// weights: the model's weight tensors (names and shapes), for the best copy.
  EarlyStopping(EarlyStoppingSpec spec, const std::vector<TensorView>& weights);

  /// Keras's on_epoch_end for epoch (0-based); weights: the current weights (views as `weights`
  /// above), copied when they are the best. Returns true when training is to stop after it.
  bool on_epoch_end(int epoch, const NamedMetrics& metrics, const std::vector<TensorView>& weights);
  /// True once an epoch's end decided to stop (also after a resume from that epoch's checkpoint).
  bool stopped() const;
  /// With restore_best_weights, once a best was seen: copies it into weights (views of host
  /// memory the caller uploads) and returns the best epoch (1-based); else 0.
  int restore_best(const std::vector<TensorView>& weights) const;
  /// Its state as host tensors, for ModelTensors.
  std::vector<HostTensor> tensors();

 private:
  EarlyStoppingSpec spec_;
  /// has_best, best (a double's bits in two floats), wait, best_epoch, stopped_epoch (1-based,
  /// 0: none), has_best_weights: all zero for a fresh state, as a checkpoint without it loads.
  std::vector<float> state_;
  std::vector<std::vector<float>> best_;  ///< restore_best_weights: one per weight tensor
  std::vector<TensorView> shapes_;        ///< the weights' names and shapes (no data)
};

class ModelCheckpoint {
 public:
  explicit ModelCheckpoint(ModelCheckpointSpec spec);
  /// True when this epoch's monitored value is the best so far (the model is to be saved);
  /// before: the best until now, for the message (nullopt: none yet).
  bool on_epoch_end(const NamedMetrics& metrics, std::optional<double>& before);
  const std::string& monitor() const { return spec_.watch.monitor; }
  std::vector<HostTensor> tensors();

 private:
  ModelCheckpointSpec spec_;
  std::vector<float> state_;  ///< has_best, best (a double's bits in two floats)
};

class ReduceLrOnPlateau {
 public:
  explicit ReduceLrOnPlateau(ReduceLrSpec spec);
  /// Keras's on_epoch_end with the rate the optimizer uses now: the new rate when it is to be
  /// reduced, else nullopt.
  std::optional<double> on_epoch_end(const NamedMetrics& metrics, double rate);
  /// The rate its last reduction set (the optimizer takes it again after a resume), or nullopt.
  std::optional<double> rate() const;
  std::vector<HostTensor> tensors();

 private:
  ReduceLrSpec spec_;
  /// has_best, best (two floats), wait, cooldown_counter, has_rate, rate (two floats).
  std::vector<float> state_;
};

}  // namespace dtrain::train
