// See optimizer.h.
#include "worker/train/optimizer.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/errors.h"

namespace dtrain::train {

Optimizer::Optimizer(const OptimizerSpec& spec, size_t parameter_count, nn::Device& device,
                     int64_t total_steps, int workers)
    : spec_(spec), schedule_(spec.learning_rate) {
  resolve_schedule(total_steps, workers);
  auto slot = [&] { return nn::Buffer<float>(device, parameter_count); };
  switch (spec_.type) {
    case OptimizerType::kSgd:
      if (spec_.sgd.momentum != 0.0f) first_ = slot();
      break;
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      first_ = slot();
      second_ = slot();
      break;
    case OptimizerType::kRmsprop:
      first_ = slot();
      if (spec_.rmsprop.momentum > 0.0f) second_ = slot();
      if (spec_.rmsprop.centered) third_ = slot();
      break;
  }
}

void Optimizer::resolve_schedule(int64_t total_steps, int workers) {
  spec_.learning_rate = schedule_;
  spec_.learning_rate.resolve(total_steps, workers);
  set_rate(static_cast<float>(spec_.learning_rate.rate(iterations_)));
}

void Optimizer::set_rate(float rate) {
  spec_.sgd.learning_rate = spec_.adam.learning_rate = rate;
  spec_.adamw.learning_rate = spec_.rmsprop.learning_rate = rate;
}

void Optimizer::begin_step() {
  set_rate(static_cast<float>(spec_.learning_rate.rate(iterations_)));
  ++iterations_;
}

void Optimizer::set_constant_rate(double rate) {
  DT_ENFORCE(spec_.learning_rate.constant(), "a rate set on a {} schedule",
             spec_.learning_rate.type);
  spec_.learning_rate.initial = rate;
  set_rate(static_cast<float>(rate));
}

bool Optimizer::same_every_step() const {
  if (rate_may_change_) return false;
  switch (spec_.type) {
    case OptimizerType::kSgd:
    case OptimizerType::kRmsprop:
      return spec_.learning_rate.constant();
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      return false;
  }
  return false;
}

void Optimizer::apply(nn::Backend& backend, nn::Buffer<float>& parameters,
                      const nn::Buffer<float>& gradients, size_t offset, size_t count,
                      const float* skip, const float* previous_skipped) {
  DT_ENFORCE(offset + count <= parameters.size() && parameters.size() == gradients.size(),
             "optimizer range {}+{} of {} parameters", offset, count, parameters.size());
  DT_ENFORCE(previous_skipped == nullptr || iterations_ >= 2,
             "a gate on the step before the optimizer's step {}", iterations_);
  // iterations_ counts this step; after a skip of the one before, the count before this step
  // is iterations_ - 2, not iterations_ - 1 (docs/design.md#loss-scaling).
  const nn::SkipGate gate{
      skip, previous_skipped,
      previous_skipped ? static_cast<float>(spec_.learning_rate.rate(iterations_ - 2)) : 0.0f};
  if (count == 0) return;
  if (spec_.type != OptimizerType::kAdamW && spec_.weight_decay > 0)
    decay(backend, parameters.data(), offset, count, gate);
  float* w = parameters.data() + offset;
  const float* g = gradients.data() + offset;
  auto at = [&](nn::Buffer<float>& slot) {
    return slot.size() == 0 ? nullptr : slot.data() + offset;
  };
  switch (spec_.type) {
    case OptimizerType::kSgd: {
      nn::SgdParams p = spec_.sgd;
      p.gate = gate;
      backend.sgd_update(p, count, w, g, at(first_));
      break;
    }
    case OptimizerType::kAdam: {
      nn::AdamParams p = spec_.adam;
      p.gate = gate;
      backend.adam_update(p, iterations_, count, w, g, at(first_), at(second_));
      break;
    }
    case OptimizerType::kAdamW: {  // its decay is in its update: excluded pieces get none
      for_each_piece(offset, count, [&](size_t begin, size_t end, bool decayed) {
        nn::AdamWParams p = spec_.adamw;
        p.gate = gate;
        if (!decayed) p.weight_decay = 0;
        backend.adamw_update(p, iterations_, end - begin, parameters.data() + begin,
                             gradients.data() + begin, first_.data() + begin,
                             second_.data() + begin);
      });
      break;
    }
    case OptimizerType::kRmsprop: {
      nn::RmspropParams p = spec_.rmsprop;
      p.gate = gate;
      backend.rmsprop_update(p, count, w, g, at(first_), at(second_), at(third_));
      break;
    }
  }
}

void Optimizer::set_parameters(const std::vector<nn::ParamInfo>& tensors) {
  excluded_.clear();
  for (const nn::ParamInfo& t : tensors) {
    for (const std::string& name : spec_.exclude_from_weight_decay) {
      if (t.name.find(name) == std::string::npos) continue;
      excluded_.push_back({t.offset, t.count});
      break;
    }
  }
  std::sort(excluded_.begin(), excluded_.end(),
            [](const nn::ParamRange& a, const nn::ParamRange& b) { return a.offset < b.offset; });
}

template <class F>
void Optimizer::for_each_piece(size_t offset, size_t count, F f) const {
  size_t at = offset;
  const size_t end = offset + count;
  for (const nn::ParamRange& r : excluded_) {
    const size_t begin = std::max(r.offset, at), stop = std::min(r.offset + r.count, end);
    if (begin >= stop) continue;
    if (at < begin) f(at, begin, true);
    f(begin, stop, false);
    at = stop;
  }
  if (at < end) f(at, end, true);
}

void Optimizer::decay(nn::Backend& backend, float* parameters, size_t offset, size_t count,
                      const nn::SkipGate& gate) {
  nn::DecayParams p;
  p.learning_rate = spec_.sgd.learning_rate;  // every type's rate is the step's (set_rate)
  p.weight_decay = spec_.weight_decay;
  p.gate = gate;
  for_each_piece(offset, count, [&](size_t begin, size_t end, bool decayed) {
    if (decayed) backend.decay_weights(p, end - begin, parameters + begin);
  });
}

std::vector<std::pair<std::string, nn::Buffer<float>*>> Optimizer::slots() {
  std::vector<std::pair<std::string, nn::Buffer<float>*>> named;
  auto add = [&](const char* name, nn::Buffer<float>& slot) {
    if (slot.size() != 0) named.emplace_back(name, &slot);
  };
  switch (spec_.type) {
    case OptimizerType::kSgd:
      add("sgd.velocity", first_);
      break;
    case OptimizerType::kAdam:
      add("adam.m", first_);
      add("adam.v", second_);
      break;
    case OptimizerType::kAdamW:
      add("adamw.m", first_);
      add("adamw.v", second_);
      break;
    case OptimizerType::kRmsprop:
      add("rmsprop.velocity", first_);
      add("rmsprop.momentum", second_);
      add("rmsprop.average_gradient", third_);
      break;
  }
  return named;
}

}  // namespace dtrain::train
