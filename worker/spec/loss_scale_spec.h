// train.loss_scale as the job writes it (Keras's LossScaleOptimizer, docs/design.md#loss-scaling):
// dynamic or fixed, with Keras's defaults. Parsing only; worker/train/loss_scale.h is the rule.
#pragma once

#include <cstdint>

#include "common/json.h"

namespace dtrain::train {

/// The largest dynamic_growth_steps: the count of finite steps is kept as a float in device
/// memory (Backend::update_loss_scale), exact up to 2^24.
constexpr int64_t kMaxGrowthSteps = int64_t{1} << 24;

/// train.loss_scale, with Keras's defaults.
struct LossScaleSpec {
  bool enabled = false;         ///< off: gradients are neither scaled nor checked
  bool dynamic = true;          ///< false: a fixed scale; nothing is checked or skipped (Keras)
  float initial_scale = 32768;  ///< Keras's initial_scale, 2^15 (the fixed scale when !dynamic)
  int64_t growth_steps = 2000;  ///< Keras's dynamic_growth_steps
};

/// Parses train.loss_scale: "dynamic", a number > 0 (a fixed scale), or an object
/// {"initial_scale": > 0, "dynamic_growth_steps": 1 to kMaxGrowthSteps} (dynamic). The result is
/// enabled. Throws ConfigError naming the JSON path.
LossScaleSpec parse_loss_scale(const common::JsonNode& node);

}  // namespace dtrain::train
