// Keras's Concatenate as dtrain reads it: its keys (from a job file or a Keras model file) and
// its shape rules. The layer that runs, and what it computes, is
// worker/nn/layers/concatenate.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

class ConcatenateConfig : public LayerConfig {
 public:
  int arity() const override { return 0; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
};

/// Parses a layer object of type "concatenate"; ConfigError naming the JSON path for anything
/// wrong.
std::unique_ptr<LayerConfig> parse_concatenate(const common::JsonNode& node);
/// The keys of Keras's Concatenate.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_concatenate();

}  // namespace dtrain::nn::layers
