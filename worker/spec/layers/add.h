// Keras's Add as dtrain reads it: its keys (from a job file or a Keras model file) and its shape
// rules. The layer that runs, and what it computes, is worker/nn/layers/add.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

class AddConfig : public LayerConfig {
 public:
  int arity() const override { return 0; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
};

/// Parses a layer object of type "add"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_add(const common::JsonNode& node);
/// The keys of Keras's Add.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_add();

}  // namespace dtrain::nn::layers
