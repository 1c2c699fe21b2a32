// The loss as the tests knew it before the loss stayed on the device: runs a backend's
// softmax_cross_entropy on host memory (host backends only) and returns the mean loss and the
// correct count, so the oracle tests can compare numbers directly.
#pragma once

#include <cstdint>

#include "worker/nn/backend.h"

namespace dtrain::testing {

/// Mean loss over n rows; *correct gets the rows whose arg-max is the label. Host memory only.
inline float mean_softmax_loss(nn::Backend& be, int n, int classes, const float* logits,
                               const int32_t* labels, float* dlogits, int* correct) {
  float totals[3] = {0, 0, 0};
  be.softmax_cross_entropy(n, classes, logits, labels, dlogits, totals);
  *correct = static_cast<int>(totals[1]);
  return totals[0] / static_cast<float>(n);
}

}  // namespace dtrain::testing
