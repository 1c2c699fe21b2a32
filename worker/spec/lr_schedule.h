// Keras's learning-rate schedules as a function of the optimizer's step: a constant, CosineDecay
// (with Keras 3's linear warm-up) and ExponentialDecay, plus Horovod/Goyal-style scaling of the
// rate by the number of workers. Pure arithmetic in double: the rate of a step depends only on the
// step, so a resumed run gets the same rates as one that never stopped. Parsing lives here too.
#pragma once

#include <cstdint>
#include <string>

#include "common/json.h"

namespace dtrain::train {

struct LearningRateSchedule {
  std::string type = "constant";  ///< constant | cosine_decay | exponential_decay
  double initial = 0.01;          ///< Keras's initial_learning_rate (or the constant)
  /// Steps the decay takes. 0 (the key left out): the whole run, epochs x steps per epoch, which
  /// the trainer fills in with resolve().
  int64_t decay_steps = 0;
  double alpha = 0.0;           ///< cosine: the floor, as a fraction of the decayed-from rate
  double decay_rate = 0.96;     ///< exponential: rate^(step / decay_steps)
  bool staircase = false;       ///< exponential: integer division of step / decay_steps
  int64_t warmup_steps = 0;     ///< cosine: linear from initial to warmup_target first
  double warmup_target = -1.0;  ///< cosine: < 0 means no warm-up target (Keras's None)
  /// Multiply every rate by the number of training workers (the global batch is that many
  /// times the per-worker batch): Goyal et al.'s linear scaling rule, as Horovod does by hand.
  bool scale_by_workers = false;

  /// Fills decay_steps when left out (total_steps: the run's steps) and applies the scaling.
  /// Call once, before rate().
  void resolve(int64_t total_steps, int workers);
  /// The rate for 0-based optimizer step `step` (Keras evaluates the schedule at `iterations`
  /// before it is incremented).
  double rate(int64_t step) const;
  /// True when rate() is the same for every step.
  bool constant() const { return type == "constant"; }
};

/// Parses an optimizer's "learning_rate" value: a number (a constant) or a schedule object
/// {"type": "cosine_decay" | "exponential_decay", "initial_learning_rate", ...}. Throws
/// ConfigError naming the JSON path.
LearningRateSchedule parse_learning_rate(const common::JsonNode& node);

}  // namespace dtrain::train
