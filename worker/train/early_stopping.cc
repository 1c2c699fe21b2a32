// See early_stopping.h. The decisions follow Keras 3's EarlyStopping and MonitorCallback: the
// wait counts every judged epoch; an improvement (beyond min_delta, in the mode's direction)
// records the best and, when it also beats the baseline, resets the wait; training stops once the
// wait reaches patience, never after the first epoch.
#include "worker/train/early_stopping.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "common/errors.h"

namespace dtrain::train {
namespace {

enum Slot { kHasBest, kBestLow, kBestHigh, kWait, kBestEpoch, kStoppedEpoch, kHasWeights, kSlots };

// flat: {"type": "EarlyStopping", keys...}; else Keras's config object.
EarlyStoppingSpec parse_early_stopping(const common::JsonNode& node, bool validation, bool flat) {
  if (flat) {
    node.check_keys({"type", "monitor", "min_delta", "patience", "verbose", "mode", "baseline",
                     "restore_best_weights", "start_from_epoch"});
  } else {
    node.check_keys({"monitor", "min_delta", "patience", "verbose", "mode", "baseline",
                     "restore_best_weights", "start_from_epoch"});
  }
  EarlyStoppingSpec s;
  if (auto n = node.find("monitor")) s.monitor = n->as_string();
  if (s.monitor != "loss" && s.monitor != "accuracy" && s.monitor != "val_loss" &&
      s.monitor != "val_accuracy") {
    node.at("monitor").fail(fmt::format(
        "\"{}\" is not a metric this run logs (loss, accuracy, val_loss, val_accuracy)",
        s.monitor));
  }
  if (s.monitor.rfind("val_", 0) == 0 && !validation) {
    const std::string what = fmt::format(
        "\"{}\" needs validation, and train.validation is false (monitor \"loss\", or turn "
        "validation on)",
        s.monitor);
    if (auto n = node.find("monitor")) n->fail(what);
    node.fail("monitor (Keras's default) " + what);
  }
  if (auto n = node.find("min_delta")) s.min_delta = std::fabs(n->as_number(-1e300, 1e300));
  if (auto n = node.find("patience")) s.patience = static_cast<int>(n->as_int(0, 1 << 20));
  if (auto n = node.find("verbose")) n->as_int(0, 2);  // dtrain always says when it stops
  std::string mode = "auto";
  if (auto n = node.find("mode")) mode = n->as_string();
  if (mode != "auto" && mode != "min" && mode != "max")
    node.at("mode").fail(fmt::format("\"{}\" is not auto, min or max", mode));
  s.maximize = mode == "max" || (mode == "auto" && s.monitor.find("accuracy") != std::string::npos);
  if (auto n = node.find("baseline"); n && !n->is_null()) s.baseline = n->as_number(-1e300, 1e300);
  if (auto n = node.find("restore_best_weights")) s.restore_best_weights = n->as_bool();
  if (auto n = node.find("start_from_epoch"))
    s.start_from_epoch = static_cast<int>(n->as_int(0, 1 << 20));
  return s;
}

}  // namespace

std::optional<EarlyStoppingSpec> parse_callbacks(const common::JsonNode& node, bool validation) {
  if (!node.is_array()) node.fail(fmt::format("expected a list, found {}", node.describe()));
  std::optional<EarlyStoppingSpec> early;
  for (const common::JsonNode& item : node.as_array()) {
    if (!item.is_object())
      item.fail(fmt::format("expected a callback object, found {}", item.describe()));
    const bool keras = item.find("class_name").has_value();
    const std::string name = (keras ? item.at("class_name") : item.at("type")).as_string();
    std::optional<common::JsonNode> config;
    if (keras) {
      item.check_keys({"class_name", "config", "module", "registered_name"});
      config = item.find("config");
    }
    if (name == "EarlyStopping" || name == "early_stopping") {
      if (early) item.fail("a second EarlyStopping: give one");
      common::JsonDocument empty = common::JsonDocument::parse("{}", "callbacks");
      early = keras ? parse_early_stopping(config ? *config : empty.root(), validation, false)
                    : parse_early_stopping(item, validation, true);
    } else if (name == "TerminateOnNaN" || name == "terminate_on_nan") {
      // Always on: every step's loss and each checkpoint's weights are checked.
    } else {
      item.fail(fmt::format(
          "callback \"{}\" is not supported (EarlyStopping and TerminateOnNaN are; "
          "ReduceLROnPlateau and ModelCheckpoint are not yet)",
          name));
    }
  }
  return early;
}

EarlyStopping::EarlyStopping(EarlyStoppingSpec spec, const std::vector<TensorView>& weights)
    : spec_(std::move(spec)), state_(kSlots, 0.0f) {
  for (const TensorView& w : weights) {
    shapes_.push_back({w.name, w.shape, nullptr, w.count});
    if (spec_.restore_best_weights) best_.emplace_back(w.count, 0.0f);
  }
}

bool EarlyStopping::improves(double value, double reference) const {
  return spec_.maximize ? value - spec_.min_delta > reference
                        : value + spec_.min_delta < reference;
}

bool EarlyStopping::on_epoch_end(int epoch,
                                 const std::vector<std::pair<std::string, double>>& metrics,
                                 const std::vector<TensorView>& weights) {
  const double* current = nullptr;
  for (const auto& [name, value] : metrics)
    if (name == spec_.monitor) current = &value;
  DT_ENFORCE(current, "EarlyStopping: no {} among the epoch's metrics", spec_.monitor);
  if (epoch < spec_.start_from_epoch) return false;
  auto keep_weights = [&] {
    for (size_t i = 0; i < best_.size(); ++i)
      std::copy(weights[i].data, weights[i].data + weights[i].count, best_[i].begin());
    state_[kHasWeights] = 1;
  };
  if (spec_.restore_best_weights && state_[kHasWeights] == 0) {  // the first judged epoch's
    keep_weights();
    state_[kBestEpoch] = static_cast<float>(epoch);
  }
  state_[kWait] += 1;
  double best = 0;
  std::memcpy(&best, &state_[kBestLow], sizeof best);
  const bool has_best = state_[kHasBest] != 0 || spec_.baseline.has_value();
  if (state_[kHasBest] == 0 && spec_.baseline) best = *spec_.baseline;
  if (!has_best || improves(*current, best)) {
    state_[kHasBest] = 1;
    std::memcpy(&state_[kBestLow], current, sizeof *current);
    state_[kBestEpoch] = static_cast<float>(epoch);
    if (spec_.restore_best_weights) keep_weights();
    if (!spec_.baseline || improves(*current, *spec_.baseline)) state_[kWait] = 0;
    return false;
  }
  if (state_[kWait] >= static_cast<float>(spec_.patience) && epoch > 0) {
    state_[kStoppedEpoch] = static_cast<float>(epoch + 1);
    return true;
  }
  return false;
}

bool EarlyStopping::stopped() const {
  return state_[kStoppedEpoch] > 0;
}

int EarlyStopping::stopped_epoch() const {
  return static_cast<int>(state_[kStoppedEpoch]);
}

int EarlyStopping::restore_best(const std::vector<TensorView>& weights) const {
  if (!spec_.restore_best_weights || state_[kHasWeights] == 0) return 0;
  for (size_t i = 0; i < best_.size(); ++i)
    std::copy(best_[i].begin(), best_[i].end(), const_cast<float*>(weights[i].data));
  return static_cast<int>(state_[kBestEpoch]) + 1;
}

std::vector<HostTensor> EarlyStopping::tensors() {
  std::vector<HostTensor> out = {
      {"callbacks.early_stopping.state", {static_cast<int64_t>(kSlots)}, &state_}};
  for (size_t i = 0; i < best_.size(); ++i) {
    out.push_back(
        {"callbacks.early_stopping.best." + shapes_[i].name, shapes_[i].shape, &best_[i]});
  }
  return out;
}

}  // namespace dtrain::train
