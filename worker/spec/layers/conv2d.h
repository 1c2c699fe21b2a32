// Keras's Conv2D as dtrain reads it: its keys (from a job file or a Keras model file) and its
// shape rules. The layer that runs, and what it computes, is worker/nn/layers/conv2d.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/layers/layer_keys.h"

namespace dtrain::nn::layers {

struct Conv2dKeys {
  int filters = 0;
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  bool same_padding = false;
  bool use_bias = true;
  Activation activation = Activation::kLinear;
  Initializer init = Initializer::kGlorotUniform;
  Regularizer kernel_regularizer, bias_regularizer;
  bool regularized() const {
    return kernel_regularizer.l1 > 0 || kernel_regularizer.l2 > 0 || bias_regularizer.l1 > 0 ||
           bias_regularizer.l2 > 0;
  }
};

/// One example's convolution for these keys and input (n = 1): the layer's shape and its cost's.
ConvShape conv_shape_of(const Conv2dKeys& k, Dims in);

class Conv2dConfig : public LayerConfig {
 public:
  explicit Conv2dConfig(const Conv2dKeys& keys) : k_(keys) {}
  const Conv2dKeys& keys() const { return k_; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override;
  Activation activation() const override { return k_.activation; }
  bool gpu_tested() const override;
  LayerCost cost(const std::vector<Dims>& in) const override;

 private:
  Conv2dKeys k_;
};

/// Parses a layer object of type "conv2d"; ConfigError naming the JSON path for anything wrong.
std::unique_ptr<LayerConfig> parse_conv2d(const common::JsonNode& node);
/// The keys of Keras's Conv2D.get_config() beyond Layer's own, and how each is taken.
std::vector<KerasKeySpec> keras_keys_conv2d();

}  // namespace dtrain::nn::layers
