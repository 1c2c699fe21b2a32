// The `train` object of a job (docs/train-config.md): Keras names and defaults, every
// key checked, errors naming the JSON path. Parsing only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/errors.h"
#include "worker/spec/callback_specs.h"
#include "worker/spec/communication.h"
#include "worker/spec/data_config.h"
#include "worker/spec/loss_scale_spec.h"
#include "worker/spec/math_mode.h"
#include "worker/spec/model_spec.h"
#include "worker/spec/optimizer_spec.h"

namespace dtrain::train {

struct BackupSpec {
  std::string dir = "backup";    ///< relative to the run directory
  int64_t save_every_steps = 0;  ///< 0: at each epoch end ("epoch")
  int keep = 2;
  bool delete_on_success = true;
};

/// train.tensorboard: Keras's TensorBoard callback, run by the chief.
struct TensorBoardSpec {
  bool enabled = true;
  std::string log_dir = "tensorboard";  ///< relative to the run directory
  /// batch_* summaries every N steps (Keras's update_freq N; "batch" is 1); 0: "epoch", none.
  int64_t update_every_steps = 0;
};

/// train.device: where training runs.
enum class DeviceChoice {
  kAuto,  ///< CUDA when this build has it and a GPU is visible, else the CPU
  kCpu,
  kCuda,
};

/// One of train.metrics that validation computes beside the loss and its companion.
struct MetricSpec {
  std::string name;  ///< as logged: Keras's name as the job wrote it
  enum class Kind { kTopK, kMeanAbsolute, kMeanSquared } kind = Kind::kTopK;
  int k = 5;  ///< kTopK: a row counts when its label is among the k largest outputs
};

struct TrainConfig {
  nn::ModelSpec model;
  /// train.model as compact JSON (a Keras file's translation, for {"keras": FILE}): the
  /// architecture checkpoints record.
  std::string model_json;
  /// {"keras": FILE}: the Keras model's envelope (KerasModel::keras_config), which the chief
  /// writes back as RUN_DIR/model/model.keras with the trained weights; "" otherwise.
  std::string keras_config;
  /// train.loss's type (docs/design.md#losses): sparse categorical cross-entropy by default.
  nn::Loss loss = nn::Loss::kSparseCategorical;
  bool from_logits = false;  ///< Keras's default (also for the shorthand "loss": "<name>")
  /// train.loss.label_smoothing: targets (1 - s) * onehot + s / classes (Keras's
  /// CategoricalCrossentropy's), in training and in validation alike.
  float label_smoothing = 0;
  /// The metric every step computes beside the loss (the loss's companion, TargetLossShape):
  /// "accuracy" for the cross-entropies, "mae" for mean_squared_error, "mse" for
  /// mean_absolute_error. Logged as itself and, validated, as "val_" + itself.
  std::string companion = "accuracy";
  /// train.metrics beyond the companion, computed where the model is validated and by `dtrain
  /// evaluate` (docs/design.md#losses): each a Keras name as written ("mae", "top_k_categorical_
  /// accuracy", ...) and, for the top-k accuracies, k.
  std::vector<MetricSpec> metrics;
  OptimizerSpec optimizer;
  data::DataConfig data;
  int per_worker_batch_size = 32;  ///< Keras's default batch size
  int epochs = 1;
  int64_t steps_per_epoch = 0;  ///< 0: one pass over the worker's shard
  bool validation = false;
  uint64_t seed = 0;
  DeviceChoice device = DeviceChoice::kAuto;
  comm::Communication communication = comm::Communication::kAuto;  ///< auto | ring | shm | nccl
  /// Start each gradient bucket's all-reduce as soon as backward has produced it (false: after
  /// the whole backward pass; same buckets, so the same result bit for bit).
  bool overlap = true;
  /// Debug: each worker writes the example ids of every step's shards to RUN_DIR/ledger/
  /// (docs/design.md#elastic-membership, the ledger).
  bool ledger = false;
  /// Capture the whole step as a CUDA graph where shapes are fixed (CUDA device, NCCL or one
  /// worker, SGD, no dropout); false runs the same work launch by launch.
  bool cuda_graphs = true;
  /// train.dtype_policy ("float32", "mixed_bfloat16", "mixed_float16": Keras's names) with
  /// train.allow_tf32 (float32 on TF32 tensor cores; off by default, as in PyTorch).
  nn::MathMode math = nn::MathMode::kFloat32;
  /// train.dtype_policy_fallback "float32": a mixed policy on a CPU without its 16-bit products
  /// trains in float32 with a warning; "none" (the default): exit 2.
  bool dtype_policy_fallback = false;
  /// train.loss_scale (Keras's LossScaleOptimizer): on, dynamic, under mixed_float16 unless the
  /// key says otherwise; off under the other policies unless the key turns it on.
  LossScaleSpec loss_scale = {};
  BackupSpec backup;
  TensorBoardSpec tensorboard;
  /// train.callbacks (docs/design.md#callbacks); TerminateOnNaN is always on.
  CallbackSpecs callbacks;
};

/// The metric names an epoch logs, in Keras's order: loss, the companion, the metrics; and with
/// validation each again as "val_" + name.
std::vector<std::string> logged_metrics(const TrainConfig& config);

/// Keras's name of the policy config.math computes under: TF32 is float32's ("float32",
/// "mixed_bfloat16", "mixed_float16"), what checkpoints and model.json record.
std::string dtype_policy_name(const TrainConfig& config);

/// Why this CPU cannot compute the mixed policy math (no bf16 products, or float16 on any CPU),
/// for the worker's refusal or fallback warning and the launcher's check before a launch.
std::string cpu_policy_lack(nn::MathMode math);
/// The error a mixed policy this CPU cannot compute is, without dtype_policy_fallback: exit 2
/// naming source and train.dtype_policy.
common::ConfigError cpu_policy_error(nn::MathMode math, const std::string& source);

/// Parses the train object (JSON text). source names it in errors ("job.json: train.epochs: ...").
TrainConfig parse_train_config(std::string_view json, const std::string& source);

}  // namespace dtrain::train
