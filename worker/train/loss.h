// The loss a training step and a validation pass run (docs/design.md#losses): sparse categorical
// cross-entropy over each row of class scores (a sequence's every position), or a loss against
// float targets (nn::TargetLossShape), behind one call.
#pragma once

#include <cstdint>

#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"

namespace dtrain::train {

struct LossOptions {
  nn::Loss kind = nn::Loss::kSparseCategorical;
  /// binary_crossentropy's from_logits (the cross-entropies over classes fold the last layer's
  /// softmax into the loss whichever it is).
  bool from_logits = true;
  float label_smoothing = 0;
};

inline LossOptions loss_options(const TrainConfig& config) {
  return {config.loss, config.from_logits, config.label_smoothing};
}

/// The loss of n examples' outputs (the model's last forward) against their labels (label words:
/// class indices, or target rows' bits), as the backend's loss calls say: writes the gradient of
/// the mean loss to doutputs unless it is null, and adds the loss, the companion metric and the
/// row count to totals[0..2].
inline void apply_loss(nn::Backend& backend, const LossOptions& loss, const nn::Model& model, int n,
                       const float* outputs, const int32_t* labels, float* doutputs,
                       float* totals) {
  if (loss.kind == nn::Loss::kSparseCategorical) {
    backend.softmax_cross_entropy_smoothed(n * model.positions(), model.classes(),
                                           loss.label_smoothing, outputs, labels, doutputs, totals);
    return;
  }
  nn::TargetLossShape s;
  s.loss = loss.kind;
  s.n = n;
  s.units = model.classes();
  s.from_logits = loss.from_logits;
  s.smoothing = loss.label_smoothing;
  backend.target_loss(s, outputs, labels, doutputs, totals);
}

/// Label words per example: a sequence's positions (sparse), else the output's units for a
/// float-target loss, else 1.
inline int label_words(const LossOptions& loss, const nn::Model& model) {
  return loss.kind == nn::Loss::kSparseCategorical ? model.positions() : model.classes();
}

}  // namespace dtrain::train
