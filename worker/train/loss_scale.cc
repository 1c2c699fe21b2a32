// See loss_scale.h.
#include "worker/train/loss_scale.h"

#include <algorithm>
#include <cmath>

namespace dtrain::train {

LossScale::LossScale(const LossScaleSpec& spec) : spec_(spec) {
  set_state({});
}

bool LossScale::update(bool finite) {
  if (!dynamic()) return true;
  if (!finite) {
    scale_ = std::max(scale_ / 2, 1.0f);  // tf.keras's floor: a scale never halves to 0
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ >= spec_.growth_steps) {
    good_steps_ = 0;
    if (std::isfinite(scale_ * 2)) scale_ *= 2;
  }
  return true;
}

void LossScale::set_state(const LossScaleState& state) {
  bool initial = !dynamic() || !(state.scale > 0) || !std::isfinite(state.scale);
  scale_ = !spec_.enabled ? 1.0f : initial ? spec_.initial_scale : state.scale;
  good_steps_ = initial ? 0 : state.good_steps;
}

}  // namespace dtrain::train
