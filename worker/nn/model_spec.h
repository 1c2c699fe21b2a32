// The `train.model` object: input shape and layers with Keras's names and defaults, parsed and
// checked (errors name the JSON path). Knows nothing of buffers or backends.
#pragma once

#include <string>
#include <vector>

#include "common/json.h"

namespace dtrain::nn {

enum class Activation { kLinear, kRelu, kSoftmax };

struct LayerSpec {
  std::string type;  ///< conv2d, max_pooling2d, flatten, dense, dropout, relu
  // conv2d
  int filters = 0;
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  bool same_padding = false;
  // max_pooling2d
  int pool_h = 2, pool_w = 2;
  // dense
  int units = 0;
  // dropout
  float rate = 0;
  Activation activation = Activation::kLinear;
};

struct ModelSpec {
  int height = 0, width = 0, channels = 0;  ///< input_shape [h, w, c] (channels last, as Keras)
  std::vector<LayerSpec> layers;
};

/// Parses train.model. Throws ConfigError "model.layers[2].units: ..." for anything wrong.
ModelSpec parse_model_spec(const common::JsonNode& node);

/// Keras "same" padding for one dimension: {before, after}.
std::pair<int, int> same_padding(int in, int kernel, int stride);

}  // namespace dtrain::nn
