// See optimizer.h.
#include "worker/train/optimizer.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace dtrain::train {

OptimizerSpec parse_optimizer_spec(const common::JsonNode& node) {
  OptimizerSpec spec;
  spec.type = node.at("type").as_string();
  auto number = [&](const char* key, float& field, double min, double max) {
    if (auto n = node.find(key)) field = static_cast<float>(n->as_number(min, max));
  };
  auto rate = [&](float& field) {
    spec.learning_rate.initial = field;
    if (auto n = node.find("learning_rate")) spec.learning_rate = parse_learning_rate(*n);
    if (auto n = node.find("scale_learning_rate"))
      spec.learning_rate.scale_by_workers = n->as_bool();
    field = static_cast<float>(spec.learning_rate.initial);
  };
  if (spec.type == "sgd") {
    node.check_keys({"type", "learning_rate", "scale_learning_rate", "momentum", "nesterov"});
    rate(spec.sgd.learning_rate);
    number("momentum", spec.sgd.momentum, 0, 1);
    if (auto n = node.find("nesterov")) spec.sgd.nesterov = n->as_bool();
  } else if (spec.type == "adam") {
    node.check_keys(
        {"type", "learning_rate", "scale_learning_rate", "beta_1", "beta_2", "epsilon"});
    rate(spec.adam.learning_rate);
    number("beta_1", spec.adam.beta_1, 0, 0.999999);
    number("beta_2", spec.adam.beta_2, 0, 0.999999999);
    number("epsilon", spec.adam.epsilon, 1e-30, 1);
  } else {
    node.at("type").fail(fmt::format("unknown optimizer \"{}\" (expected sgd or adam)", spec.type));
  }
  return spec;
}

Optimizer::Optimizer(const OptimizerSpec& spec, size_t parameter_count, nn::Device& device,
                     int64_t total_steps, int workers)
    : spec_(spec) {
  spec_.learning_rate.resolve(total_steps, workers);
  spec_.sgd.learning_rate = spec_.adam.learning_rate =
      static_cast<float>(spec_.learning_rate.rate(0));
  bool slot_needed = spec_.type == "adam" || spec_.sgd.momentum != 0.0f;
  if (slot_needed) first_ = nn::Buffer<float>(device, parameter_count);
  if (spec_.type == "adam") second_ = nn::Buffer<float>(device, parameter_count);
}

void Optimizer::begin_step() {
  float rate = static_cast<float>(spec_.learning_rate.rate(iterations_));
  ++iterations_;
  spec_.sgd.learning_rate = spec_.adam.learning_rate = rate;
}

void Optimizer::apply(nn::Backend& backend, nn::Buffer<float>& parameters,
                      const nn::Buffer<float>& gradients, size_t offset, size_t count) {
  DT_ENFORCE(offset + count <= parameters.size() && parameters.size() == gradients.size(),
             "optimizer range {}+{} of {} parameters", offset, count, parameters.size());
  if (count == 0) return;
  float* w = parameters.data() + offset;
  const float* g = gradients.data() + offset;
  if (spec_.type == "adam") {
    backend.adam_update(spec_.adam, iterations_, count, w, g, first_.data() + offset,
                        second_.data() + offset);
  } else {
    backend.sgd_update(spec_.sgd, count, w, g,
                       first_.size() == 0 ? nullptr : first_.data() + offset);
  }
}

std::vector<std::pair<std::string, nn::Buffer<float>*>> Optimizer::slots() {
  if (spec_.type == "adam") return {{"adam.m", &first_}, {"adam.v", &second_}};
  if (first_.size() != 0) return {{"sgd.velocity", &first_}};
  return {};
}

}  // namespace dtrain::train
