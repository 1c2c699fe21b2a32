// Keras's optimizer hyper-parameters as the job sets them (train.optimizer) and the backend's
// update kernels take them (worker/nn/backend.h): plain values, read by the spec library and
// applied by the worker's runtime.
#pragma once

namespace dtrain::nn {

/// How a dynamic loss scale's decision reaches an optimizer update without the host
/// (docs/design.md#loss-scaling). Both flags are device memory, or null (no gate).
struct SkipGate {
  const float* skip = nullptr;  ///< raised (!= 0): this update changes nothing
  /// Raised: the step before this one was skipped, so the optimizer's count is one lower than
  /// the host assumed: the update uses learning_rate_after_skip, and Adam step - 1.
  const float* previous = nullptr;
  float learning_rate_after_skip = 0.0f;
};

/// Keras 3's weight decay on any optimizer, applied before its update: w = w - w * weight_decay *
/// learning_rate (Keras's _apply_weight_decay, in that order of products).
struct DecayParams {
  float learning_rate = 0.01f;
  float weight_decay = 0.0f;
  SkipGate gate = {};
};

/// Keras's optimizer hyper-parameters, with Keras's defaults.
struct SgdParams {
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  bool nesterov = false;
  SkipGate gate = {};
};
struct AdamParams {
  float learning_rate = 0.001f;
  float beta_1 = 0.9f;
  float beta_2 = 0.999f;
  float epsilon = 1e-7f;
  SkipGate gate = {};
};
struct RmspropParams {
  float learning_rate = 0.001f;
  float rho = 0.9f;
  float momentum = 0.0f;
  float epsilon = 1e-7f;
  bool centered = false;
  SkipGate gate = {};
};
struct AdamWParams {
  float learning_rate = 0.001f;
  float weight_decay = 0.004f;
  float beta_1 = 0.9f;
  float beta_2 = 0.999f;
  float epsilon = 1e-7f;
  SkipGate gate = {};
};

}  // namespace dtrain::nn
