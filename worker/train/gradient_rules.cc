// See gradient_rules.h. Keras's order: the regularizers' losses are part of the loss whose
// gradient the optimizer clips (BaseOptimizer.apply's _clip_gradients).
#include "worker/train/gradient_rules.h"

#include <cmath>

#include "common/errors.h"

namespace dtrain::train {

double regularization_penalty(nn::Model& model) {
  const std::vector<nn::ParamInfo>& tensors = model.parameter_infos();
  bool any = false;
  for (const nn::ParamInfo& t : tensors) any |= t.l1 > 0 || t.l2 > 0;
  if (!any) return 0;
  const std::vector<float> w = model.parameters().to_host();
  double penalty = 0;
  for (const nn::ParamInfo& t : tensors) {
    double abs_sum = 0, square_sum = 0;
    for (size_t i = t.offset; i < t.offset + t.count; ++i)
      abs_sum += std::fabs(w[i]), square_sum += double{w[i]} * w[i];
    penalty += t.l1 * abs_sum + t.l2 * square_sum;
  }
  return penalty;
}

GradientRules::GradientRules(const OptimizerSpec& spec, const std::vector<nn::ParamInfo>& tensors,
                             nn::Device& device)
    : clipnorm_(spec.clipnorm), global_clipnorm_(spec.global_clipnorm) {
  for (const nn::ParamInfo& t : tensors) {
    if (t.l1 > 0 || t.l2 > 0) regularized_.push_back(t);
    tensors_.push_back({t.offset, t.count});
    parameters_ += t.count;
  }
  if (active()) scratch_ = nn::Buffer<float>(device, 1 + tensors_.size());
}

void GradientRules::apply(nn::Backend& backend, const float* parameters, float* gradients,
                          float* stats) {
  if (!active()) return;
  nn::Device& device = backend.device();
  device.fill_zero(scratch_.data(), scratch_.bytes());
  float* penalty = scratch_.data();
  float* sums = scratch_.data() + 1;
  if (!regularized_.empty()) {
    for (const nn::ParamInfo& t : regularized_) {
      backend.regularize(t.count, t.l1, t.l2, parameters + t.offset, gradients + t.offset, penalty);
    }
    backend.add_penalty(penalty, stats);
  }
  if (clipnorm_ > 0) {  // each tensor by its own norm
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const nn::ParamRange& t = tensors_[i];
      backend.sum_squares(t.count, gradients + t.offset, sums + i);
      backend.clip_by_norm(t.count, clipnorm_, false, sums + i, gradients + t.offset);
    }
  } else if (global_clipnorm_ > 0) {  // every tensor by the norm of all, in tensor order
    for (const nn::ParamRange& t : tensors_)
      backend.sum_squares(t.count, gradients + t.offset, sums);
    for (const nn::ParamRange& t : tensors_)
      backend.clip_by_norm(t.count, global_clipnorm_, true, sums, gradients + t.offset);
  }
}

}  // namespace dtrain::train
