// The position table's share of a forward and backward, for the layers that learn positions
// (position_embedding.cc, token_and_position_embedding.cc): every example gets the table's first
// t rows; the table's gradient is the examples' dy summed in example order.
#pragma once

#include "worker/nn/backend.h"

namespace dtrain::nn::layers {

/// y (n examples of t x d) = the table's first t rows, each example; add: y += them instead.
inline void position_rows_forward(Backend& b, int n, int t, int d, const float* table, float* y,
                                  bool add = false) {
  const size_t block = static_cast<size_t>(t) * d;
  for (int i = 0; i < n; ++i) {
    float* yi = y + static_cast<size_t>(i) * block;
    if (add) {
      b.add(block, table, yi);
    } else {
      b.device().copy(yi, table, block * sizeof(float));
    }
  }
}

/// grad (length x d) = the sum over the n examples of dy's t x d, in example order; rows from t
/// to length get zero.
inline void position_rows_backward(Backend& b, int n, int t, int d, int length, const float* dy,
                                   float* grad) {
  const size_t block = static_cast<size_t>(t) * d;
  b.device().fill_zero(grad, static_cast<size_t>(length) * d * sizeof(float));
  for (int i = 0; i < n; ++i) b.add(block, dy + static_cast<size_t>(i) * block, grad);
}

}  // namespace dtrain::nn::layers
