// Keras's Dense as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/dense.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct DenseKeys {
  int units = 0;
  bool use_bias = true;
  Activation activation = Activation::kLinear;
  Initializer init = Initializer::kGlorotUniform;
  Regularizer kernel_regularizer, bias_regularizer;
  bool regularized() const {
    return kernel_regularizer.l1 > 0 || kernel_regularizer.l2 > 0 || bias_regularizer.l1 > 0 ||
           bias_regularizer.l2 > 0;
  }
};

class DenseConfig : public LayerConfig {
 public:
  explicit DenseConfig(const DenseKeys& keys) : k_(keys) {}
  const DenseKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  Activation activation() const override { return k_.activation; }
  bool gpu_tested() const override;
  LayerCost cost(const std::vector<Dims>& in) const override;

 private:
  DenseKeys k_;
};

/// Parses a layer object of type "dense"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_dense(const common::JsonNode& node);
/// The keys of Keras's Dense.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_dense();

}  // namespace dtrain::nn::layers
