// The numeric choices of a `train` section (docs/design.md#mixed-precision, #losses): how
// products compute and which loss a step takes. Values only; the backend computes them.
#pragma once

namespace dtrain::nn {

/// Keras's losses (docs/design.md#losses). Sparse categorical cross-entropy scores class indices
/// (Backend::softmax_cross_entropy); the others float targets (Backend::target_loss).
enum class Loss {
  kSparseCategorical,  ///< "sparse_categorical_crossentropy": one class index per row
  kCategorical,        ///< "categorical_crossentropy": a one-hot (or soft) row per example
  kBinary,             ///< "binary_crossentropy": a 0/1 target per output
  kMeanSquared,        ///< "mean_squared_error"
  kMeanAbsolute,       ///< "mean_absolute_error"
};

/// How convolutions and matrix products compute (train.dtype_policy and train.allow_tf32,
/// docs/design.md#mixed-precision). Every buffer stays fp32 whatever the mode: the 16-bit modes
/// round a product's inputs to 16 bits and accumulate in fp32, so weights, gradients, optimizer
/// slots, the loss and the softmax stay fp32 (Keras's mixed policies, master weights included).
enum class MathMode {
  kFloat32,   ///< fp32 FMA: the CPU and GPU agree to rounding
  kTf32,      ///< fp32 data on TF32 tensor cores (GPU only; the CPU computes in fp32)
  kBfloat16,  ///< Keras's "mixed_bfloat16"
  kFloat16,   ///< Keras's "mixed_float16" (TrainStep adds its loss scaling)
};
/// "float32", "tf32", "mixed_bfloat16", "mixed_float16".
const char* math_mode_name(MathMode mode);

}  // namespace dtrain::nn
