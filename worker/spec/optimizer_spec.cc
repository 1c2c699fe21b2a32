// See optimizer_spec.h.
#include "worker/spec/optimizer_spec.h"

#include <fmt/format.h>

#include <utility>

#include "common/errors.h"

namespace dtrain::train {
namespace {

constexpr std::pair<OptimizerType, const char*> kOptimizerTypes[] = {
    {OptimizerType::kSgd, "sgd"},
    {OptimizerType::kAdam, "adam"},
    {OptimizerType::kAdamW, "adamw"},
    {OptimizerType::kRmsprop, "rmsprop"}};

OptimizerType parse_optimizer_type(const common::JsonNode& node) {
  std::string name = node.as_string();
  for (const auto& [type, type_name] : kOptimizerTypes) {
    if (name == type_name) return type;
  }
  node.fail(fmt::format("unknown optimizer \"{}\" (expected sgd, adam, adamw or rmsprop)", name));
}

// Keras 3's weight_decay (every optimizer but adamw, whose own it is) and the names it leaves out.
void parse_decay(const common::JsonNode& node, OptimizerSpec& spec) {
  if (auto n = node.find("weight_decay"); n && spec.type != OptimizerType::kAdamW)
    spec.weight_decay = static_cast<float>(n->as_number(0, 1));
  if (auto n = node.find("exclude_from_weight_decay")) {
    for (const common::JsonNode& name : n->as_array())
      spec.exclude_from_weight_decay.push_back(name.as_nonempty_string());
  }
}

// Keras's clipnorm and global_clipnorm (null: none); Keras refuses both at once.
void parse_clipping(const common::JsonNode& node, OptimizerSpec& spec) {
  auto clip = [&](const char* key, float& field) {
    if (auto n = node.find(key); n && !n->is_null()) {
      field = static_cast<float>(n->as_number(0, 1e30));
      if (field <= 0) n->fail("expected a norm above 0 (or null: no clipping)");
    }
  };
  clip("clipnorm", spec.clipnorm);
  clip("global_clipnorm", spec.global_clipnorm);
  if (spec.clipnorm > 0 && spec.global_clipnorm > 0) {
    node.at("global_clipnorm")
        .fail("only one of clipnorm and global_clipnorm can be set (as in Keras)");
  }
}

// The hyper-parameters of spec.type from an object node (each key checked).
void parse_hyper_parameters(const common::JsonNode& node, OptimizerSpec& spec) {
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
  switch (spec.type) {
    case OptimizerType::kSgd:
      node.check_keys({"type", "learning_rate", "scale_learning_rate", "momentum", "nesterov",
                       "weight_decay", "exclude_from_weight_decay", "clipnorm", "global_clipnorm"});
      rate(spec.sgd.learning_rate);
      number("momentum", spec.sgd.momentum, 0, 1);
      if (auto n = node.find("nesterov")) spec.sgd.nesterov = n->as_bool();
      break;
    case OptimizerType::kAdam:
      node.check_keys({"type", "learning_rate", "scale_learning_rate", "beta_1", "beta_2",
                       "epsilon", "weight_decay", "exclude_from_weight_decay", "clipnorm",
                       "global_clipnorm"});
      rate(spec.adam.learning_rate);
      number("beta_1", spec.adam.beta_1, 0, 0.999999);
      number("beta_2", spec.adam.beta_2, 0, 0.999999999);
      number("epsilon", spec.adam.epsilon, 1e-30, 1);
      break;
    case OptimizerType::kAdamW:
      node.check_keys({"type", "learning_rate", "scale_learning_rate", "weight_decay", "beta_1",
                       "beta_2", "epsilon", "exclude_from_weight_decay", "clipnorm",
                       "global_clipnorm"});
      rate(spec.adamw.learning_rate);
      number("weight_decay", spec.adamw.weight_decay, 0, 1);
      number("beta_1", spec.adamw.beta_1, 0, 0.999999);
      number("beta_2", spec.adamw.beta_2, 0, 0.999999999);
      number("epsilon", spec.adamw.epsilon, 1e-30, 1);
      break;
    case OptimizerType::kRmsprop:
      node.check_keys({"type", "learning_rate", "scale_learning_rate", "rho", "momentum", "epsilon",
                       "centered", "weight_decay", "exclude_from_weight_decay", "clipnorm",
                       "global_clipnorm"});
      rate(spec.rmsprop.learning_rate);
      number("rho", spec.rmsprop.rho, 0, 0.999999999);
      number("momentum", spec.rmsprop.momentum, 0, 0.999999);
      number("epsilon", spec.rmsprop.epsilon, 1e-30, 1);
      if (auto n = node.find("centered")) spec.rmsprop.centered = n->as_bool();
      break;
  }
  parse_decay(node, spec);
  parse_clipping(node, spec);
}

// Keras's default rate of each type (the schedule's constant when learning_rate is left out).
float default_rate(const OptimizerSpec& spec) {
  switch (spec.type) {
    case OptimizerType::kSgd:
      return spec.sgd.learning_rate;
    case OptimizerType::kAdam:
      return spec.adam.learning_rate;
    case OptimizerType::kAdamW:
      return spec.adamw.learning_rate;
    case OptimizerType::kRmsprop:
      return spec.rmsprop.learning_rate;
  }
  return 0.0f;
}

}  // namespace

const char* optimizer_type_name(OptimizerType type) {
  for (const auto& [known, name] : kOptimizerTypes) {
    if (known == type) return name;
  }
  return "?";
}

OptimizerSpec parse_optimizer_spec(const common::JsonNode& node) {
  OptimizerSpec spec;
  if (node.is_string()) {  // Keras's shorthand: the name, every hyper-parameter its default
    spec.type = parse_optimizer_type(node);
    spec.learning_rate.initial = default_rate(spec);
    return spec;
  }
  if (!node.is_object())
    node.fail(fmt::format("expected an optimizer name or object, found {}", node.describe()));
  spec.type = parse_optimizer_type(node.at("type"));
  parse_hyper_parameters(node, spec);
  return spec;
}

}  // namespace dtrain::train
