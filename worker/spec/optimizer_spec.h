// train.optimizer as the job writes it (docs/train-config.md): Keras's SGD, Adam, AdamW and
// RMSprop with their hyper-parameters and defaults, the learning-rate schedule, weight decay and
// clipping. Parsing only; worker/train/optimizer.h applies it.
#pragma once

#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/lr_schedule.h"
#include "worker/spec/optimizer_params.h"

namespace dtrain::train {

/// train.optimizer.type, parsed once; the update switches on it.
enum class OptimizerType { kSgd, kAdam, kAdamW, kRmsprop };

/// Keras's name ("sgd", "adam", "adamw", "rmsprop").
const char* optimizer_type_name(OptimizerType type);

struct OptimizerSpec {
  OptimizerType type = OptimizerType::kSgd;
  // The hyper-parameters of each type; learning_rate there is the schedule's initial rate.
  nn::SgdParams sgd;
  nn::AdamParams adam;
  nn::AdamWParams adamw;
  nn::RmspropParams rmsprop;
  LearningRateSchedule learning_rate;  ///< the rate per step (a constant by default)
  /// Keras 3's weight_decay of sgd, adam and rmsprop (adamw's is adamw.weight_decay): w -= w *
  /// weight_decay * rate before each update. 0: none.
  float weight_decay = 0;
  /// Keras's exclude_from_weight_decay(var_names=...): a tensor whose name contains one of these
  /// is not decayed ("bias", "gamma", "beta").
  std::vector<std::string> exclude_from_weight_decay;
  /// Keras's clipnorm (each gradient tensor to this norm) and global_clipnorm (all of them
  /// together), on the step's reduced gradient (docs/design.md#regularizers-and-clipping). 0:
  /// none; at most one is set.
  float clipnorm = 0, global_clipnorm = 0;
};

/// Parses train.optimizer with Keras's defaults: an object {"type": ..., hyper-parameters}, or
/// Keras's shorthand, the type's name alone ("adam"). Throws ConfigError naming the JSON path.
OptimizerSpec parse_optimizer_spec(const common::JsonNode& node);

}  // namespace dtrain::train
