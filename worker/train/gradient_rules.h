// What happens to a step's gradient between its all-reduce and the optimizer
// (docs/design.md#regularizers-and-clipping): Keras's kernel_ and bias_regularizer (the L1L2
// penalty's gradient added, the penalty added to the step's reported loss) and then Keras's
// clipnorm or global_clipnorm. Applied once, to the reduced (mean) gradient every worker holds,
// so the result does not depend on the membership. Does not reduce, unscale or update anything.
#pragma once

#include <vector>

#include "worker/nn/backend.h"
#include "worker/nn/layer.h"
#include "worker/nn/model.h"
#include "worker/train/optimizer.h"

namespace dtrain::train {

/// The regularizers' penalty, sum over the model's tensors of l1 sum|w| + l2 sum w^2, of its
/// parameters now (read to the host, in double): what Keras adds to a validation's loss.
double regularization_penalty(nn::Model& model);

class GradientRules {
 public:
  /// tensors: the model's parameter tensors (their l1 and l2), in the flat buffer's offsets.
  GradientRules(const OptimizerSpec& spec, const std::vector<nn::ParamInfo>& tensors,
                nn::Device& device);
  /// True when there is anything to do: a step must then have every gradient reduced before
  /// any update (TrainStep applies whole steps).
  bool active() const { return !regularized_.empty() || clipnorm_ > 0 || global_clipnorm_ > 0; }
  /// On the reduced gradients of one step, before the optimizer: the regularizers' gradient
  /// added (from the parameters before the update), their penalty added to stats' loss sum
  /// (StepStats, reduced: once per example of the global batch), then the clipping.
  void apply(nn::Backend& backend, const float* parameters, float* gradients, float* stats);

 private:
  std::vector<nn::ParamInfo> regularized_;  ///< tensors with l1 or l2 above 0
  std::vector<nn::ParamRange> tensors_;     ///< every tensor, for clipnorm
  float clipnorm_ = 0, global_clipnorm_ = 0;
  size_t parameters_ = 0;
  /// Device floats: the penalty, then one sum of squares per tensor (clipnorm) or one
  /// (global_clipnorm).
  nn::Buffer<float> scratch_;
};

}  // namespace dtrain::train
