// See loss_scale_spec.h.
#include "worker/spec/loss_scale_spec.h"

#include <fmt/format.h>

#include <limits>

#include "common/errors.h"

namespace dtrain::train {

LossScaleSpec parse_loss_scale(const common::JsonNode& node) {
  constexpr double kMaxScale = std::numeric_limits<float>::max();
  LossScaleSpec s;
  s.enabled = true;
  if (node.is_string()) {
    if (node.as_string() != "dynamic") {
      node.fail(fmt::format("expected \"dynamic\", a number > 0 or an object, found {}",
                            node.describe()));
    }
  } else if (node.is_object()) {
    node.check_keys({"initial_scale", "dynamic_growth_steps"});
    if (auto n = node.find("initial_scale"))
      s.initial_scale = static_cast<float>(n->as_number(0, kMaxScale));
    if (auto n = node.find("dynamic_growth_steps")) s.growth_steps = n->as_int(1, kMaxGrowthSteps);
  } else {
    double scale = 0;
    try {
      scale = node.as_number(0, kMaxScale);
    } catch (const common::ConfigError&) {
      node.fail(fmt::format("expected \"dynamic\", a number > 0 or an object, found {}",
                            node.describe()));
    }
    s.dynamic = false;
    s.initial_scale = static_cast<float>(scale);
  }
  if (!(s.initial_scale > 0)) {
    (node.is_object() ? node.at("initial_scale") : node)
        .fail(fmt::format("the loss scale must be > 0 (it multiplies the loss), found {}",
                          s.initial_scale));
  }
  return s;
}

}  // namespace dtrain::train
