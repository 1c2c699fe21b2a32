// See callbacks.h. The decisions follow Keras 3's MonitorCallback, EarlyStopping and
// ModelCheckpoint: the wait counts every judged epoch; an improvement (beyond min_delta, in the
// mode's direction) records the best and, when it also beats the baseline, resets the wait;
// training stops once the wait reaches patience, never after the first epoch. A double is kept
// in two floats bit for bit, so a resumed run compares against exactly the same best.
#include "worker/train/callbacks.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"

namespace dtrain::train {
namespace {

enum EarlySlot { kHasBest, kBestLow, kBestHigh, kWait, kBestEpoch, kStoppedEpoch, kHasWeights };
constexpr size_t kEarlySlots = 7;
constexpr size_t kCheckpointSlots = 3;  ///< has_best, best's two halves

double read_double(const std::vector<float>& state, size_t at) {
  double value = 0;
  std::memcpy(&value, &state[at], sizeof value);
  return value;
}

void write_double(std::vector<float>& state, size_t at, double value) {
  std::memcpy(&state[at], &value, sizeof value);
}

const double* find_metric(const NamedMetrics& metrics, const std::string& name) {
  for (const auto& [key, value] : metrics)
    if (key == name) return &value;
  DT_ENFORCE(false, "no {} among the epoch's metrics", name);
  return nullptr;
}

// monitor, mode and min_delta (a ModelCheckpoint has no min_delta key, and initial_value_threshold
// for EarlyStopping's baseline).
}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingSpec spec, const std::vector<TensorView>& weights)
    : spec_(std::move(spec)), state_(kEarlySlots, 0.0f) {
  for (const TensorView& w : weights) {
    shapes_.push_back({w.name, w.shape, nullptr, w.count});
    if (spec_.restore_best_weights) best_.emplace_back(w.count, 0.0f);
  }
}

bool EarlyStopping::on_epoch_end(int epoch, const NamedMetrics& metrics,
                                 const std::vector<TensorView>& weights) {
  const double current = *find_metric(metrics, spec_.watch.monitor);
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
  const bool has_best = state_[kHasBest] != 0;
  const std::optional<double> best =
      has_best ? std::optional<double>(read_double(state_, kBestLow)) : spec_.watch.baseline;
  if (!best || spec_.watch.improves(current, *best)) {
    state_[kHasBest] = 1;
    write_double(state_, kBestLow, current);
    state_[kBestEpoch] = static_cast<float>(epoch);
    if (spec_.restore_best_weights) keep_weights();
    if (!spec_.watch.baseline || spec_.watch.improves(current, *spec_.watch.baseline))
      state_[kWait] = 0;
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

int EarlyStopping::restore_best(const std::vector<TensorView>& weights) const {
  if (!spec_.restore_best_weights || state_[kHasWeights] == 0) return 0;
  for (size_t i = 0; i < best_.size(); ++i)
    std::copy(best_[i].begin(), best_[i].end(), const_cast<float*>(weights[i].data));
  return static_cast<int>(state_[kBestEpoch]) + 1;
}

std::vector<HostTensor> EarlyStopping::tensors() {
  std::vector<HostTensor> out = {
      {"callbacks.early_stopping.state", {static_cast<int64_t>(kEarlySlots)}, &state_}};
  for (size_t i = 0; i < best_.size(); ++i) {
    out.push_back(
        {"callbacks.early_stopping.best." + shapes_[i].name, shapes_[i].shape, &best_[i]});
  }
  return out;
}

ModelCheckpoint::ModelCheckpoint(ModelCheckpointSpec spec)
    : spec_(std::move(spec)), state_(kCheckpointSlots, 0.0f) {}

bool ModelCheckpoint::on_epoch_end(const NamedMetrics& metrics, std::optional<double>& before) {
  const double current = *find_metric(metrics, spec_.watch.monitor);
  before = state_[0] != 0 ? std::optional<double>(read_double(state_, 1)) : spec_.watch.baseline;
  if (before && !spec_.watch.improves(current, *before)) return false;
  state_[0] = 1;
  write_double(state_, 1, current);
  return true;
}

std::vector<HostTensor> ModelCheckpoint::tensors() {
  return {{"callbacks.model_checkpoint.state", {static_cast<int64_t>(kCheckpointSlots)}, &state_}};
}

ReduceLrOnPlateau::ReduceLrOnPlateau(ReduceLrSpec spec) : spec_(std::move(spec)), state_(8, 0.0f) {}

// Keras's: in cooldown the counter runs down and the wait is reset; an improvement (beyond
// min_delta) records the best and resets the wait; otherwise, out of cooldown, the wait grows and
// at patience the rate is multiplied by factor (not below min_lr), the cooldown begins.
std::optional<double> ReduceLrOnPlateau::on_epoch_end(const NamedMetrics& metrics, double rate) {
  const double current = *find_metric(metrics, spec_.watch.monitor);
  auto in_cooldown = [&] { return state_[4] > 0; };
  if (in_cooldown()) {
    state_[4] -= 1;
    state_[3] = 0;
  }
  if (state_[0] == 0 || spec_.watch.improves(current, read_double(state_, 1))) {
    state_[0] = 1;
    write_double(state_, 1, current);
    state_[3] = 0;
    return std::nullopt;
  }
  if (in_cooldown()) return std::nullopt;
  state_[3] += 1;
  if (state_[3] < static_cast<float>(spec_.patience)) return std::nullopt;
  if (!(rate > static_cast<double>(static_cast<float>(spec_.min_lr)))) return std::nullopt;
  const double reduced = std::max(rate * spec_.factor, spec_.min_lr);
  state_[5] = 1;
  write_double(state_, 6, reduced);
  state_[4] = static_cast<float>(spec_.cooldown);
  state_[3] = 0;
  return reduced;
}

std::optional<double> ReduceLrOnPlateau::rate() const {
  return state_[5] != 0 ? std::optional<double>(read_double(state_, 6)) : std::nullopt;
}

std::vector<HostTensor> ReduceLrOnPlateau::tensors() {
  return {{"callbacks.reduce_lr_on_plateau.state", {8}, &state_}};
}

}  // namespace dtrain::train
