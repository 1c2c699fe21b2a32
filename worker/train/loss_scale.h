// Keras's LossScaleOptimizer for mixed_float16 (docs/design.md#loss-scaling): the loss scale and
// its rule. Dynamic: starts at 2^15, halves on a step with a non-finite gradient (that step is
// skipped; never below 1, tf.keras's floor) and doubles after dynamic_growth_steps finite steps
// in a row; or fixed. This class is the host's copy of the state and the rule's reference:
// TrainStep keeps the state in device memory and applies the same rule there
// (Backend::update_loss_scale).
#pragma once

#include <cstdint>

#include "worker/spec/loss_scale_spec.h"

namespace dtrain::train {

/// Where a dynamic scale stands; what checkpoints keep (a fixed scale keeps nothing).
struct LossScaleState {
  float scale = 0;         ///< 0: none (the spec's initial state)
  int64_t good_steps = 0;  ///< finite steps since the scale last changed
};

/// Not thread-safe; one per TrainStep.
class LossScale {
 public:
  explicit LossScale(const LossScaleSpec& spec = {});
  bool enabled() const { return spec_.enabled; }
  bool dynamic() const { return spec_.enabled && spec_.dynamic; }
  const LossScaleSpec& spec() const { return spec_; }
  /// What the loss gradient is multiplied by this step.
  float scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  /// Keras's rule after a step whose unscaled gradients were all finite or not; returns whether
  /// the optimizer applies the step. Finite: counts the step, and on the growth_steps-th in a row
  /// doubles the scale (unless that overflows) and restarts the count. Not finite: halves the
  /// scale (to no less than 1, as tf.keras's LossScaleOptimizer does, so that a model whose
  /// gradients never fit keeps a scale a checkpoint can hold, not 0), restarts the count, and the
  /// step is skipped. A fixed scale applies every step.
  bool update(bool finite);
  LossScaleState state() const { return {scale_, good_steps_}; }
  /// A checkpoint's (or the group's) state. Scale 0 (none recorded: scaling was off, or the
  /// file predates it), a scale that is not a finite number > 0, or a fixed scale's spec, gives
  /// the initial state.
  void set_state(const LossScaleState& state);

 private:
  LossScaleSpec spec_;
  float scale_ = 1;
  int64_t good_steps_ = 0;
};

}  // namespace dtrain::train
