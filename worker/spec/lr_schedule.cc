// See lr_schedule.h. Formulas follow keras.optimizers.schedules (CosineDecay, ExponentialDecay).
#include "worker/spec/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/errors.h"

namespace dtrain::train {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kMaxRate = 1e3;

double cosine_rate(const LearningRateSchedule& s, int64_t step) {
  bool warmup = s.warmup_target >= 0;
  if (warmup && step < s.warmup_steps) {
    double done = static_cast<double>(step) / static_cast<double>(s.warmup_steps);
    return s.initial + (s.warmup_target - s.initial) * done;
  }
  double from = warmup ? s.warmup_target : s.initial;
  int64_t into = warmup ? step - s.warmup_steps : step;
  double fraction = static_cast<double>(std::min(into, s.decay_steps)) /
                    static_cast<double>(std::max<int64_t>(s.decay_steps, 1));
  double cosine = 0.5 * (1.0 + std::cos(kPi * fraction));
  return from * ((1.0 - s.alpha) * cosine + s.alpha);
}

double exponential_rate(const LearningRateSchedule& s, int64_t step) {
  double p = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(s.decay_steps, 1));
  if (s.staircase) p = std::floor(p);
  return s.initial * std::pow(s.decay_rate, p);
}

void parse_schedule(const common::JsonNode& node, LearningRateSchedule& s) {
  s.type = node.at("type").as_string();
  if (s.type != "cosine_decay" && s.type != "exponential_decay") {
    node.at("type").fail(fmt::format(
        "unknown learning-rate schedule \"{}\" (expected cosine_decay or exponential_decay)",
        s.type));
  }
  auto steps = [&](const char* key, int64_t& field, int64_t min) {
    if (auto n = node.find(key)) field = n->as_int(min, int64_t{1} << 40);
  };
  s.initial = node.at("initial_learning_rate").as_number(0, kMaxRate);
  steps("decay_steps", s.decay_steps, 1);
  if (s.type == "cosine_decay") {
    node.check_keys(
        {"type", "initial_learning_rate", "decay_steps", "alpha", "warmup_steps", "warmup_target"});
    if (auto n = node.find("alpha")) s.alpha = n->as_number(0, 1);
    steps("warmup_steps", s.warmup_steps, 0);
    if (auto n = node.find("warmup_target"); n && !n->is_null())
      s.warmup_target = n->as_number(0, kMaxRate);
    if (s.warmup_steps > 0 && s.warmup_target < 0)
      node.at("warmup_steps").fail("a warm-up needs \"warmup_target\", the rate it climbs to");
  } else {
    node.check_keys({"type", "initial_learning_rate", "decay_steps", "decay_rate", "staircase"});
    s.decay_rate = node.at("decay_rate").as_number(0, 1e3);
    if (auto n = node.find("staircase")) s.staircase = n->as_bool();
  }
}

}  // namespace

void LearningRateSchedule::resolve(int64_t total_steps, int workers) {
  int64_t warmup = warmup_target >= 0 ? warmup_steps : 0;
  if (decay_steps == 0) decay_steps = std::max<int64_t>(total_steps - warmup, 1);
  if (!scale_by_workers) return;
  initial *= workers;
  if (warmup_target >= 0) warmup_target *= workers;
  scale_by_workers = false;  // applied
}

double LearningRateSchedule::rate(int64_t step) const {
  if (type == "cosine_decay") return cosine_rate(*this, step);
  if (type == "exponential_decay") return exponential_rate(*this, step);
  return initial;
}

LearningRateSchedule parse_learning_rate(const common::JsonNode& node) {
  LearningRateSchedule s;
  if (node.is_object()) {
    parse_schedule(node, s);
  } else {
    s.initial = node.as_number(0, kMaxRate);
  }
  return s;
}

}  // namespace dtrain::train
