// The `train.model` object: input shape and layers with Keras's names and defaults, parsed and
// checked (errors name the JSON path). Knows nothing of buffers or backends.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "common/json.h"

namespace dtrain::nn {

enum class Activation { kLinear, kRelu, kSoftmax };

/// train.model.layers[i].type, parsed once; code switches on it (no default, so -Wswitch names
/// a kind a switch forgot).
enum class LayerType { kConv2d, kMaxPooling2d, kFlatten, kDense, kDropout, kRelu };

/// Keras's name of a layer type ("conv2d", "max_pooling2d", ...).
const char* layer_type_name(LayerType type);

struct LayerSpec {
  LayerType type = LayerType::kDense;
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
  /// input_shape [h, w, c] (channels last, as Keras); a 2-D [h, w] is read as [h, w, 1].
  int height = 0, width = 0, channels = 0;
  std::vector<LayerSpec> layers;
};

/// Parses train.model. Throws ConfigError "model.layers[2].units: ..." for anything wrong.
ModelSpec parse_model_spec(const common::JsonNode& node);

/// train.model as compact JSON, the architecture checkpoints and model.json record: the text as
/// given, except that a 2-D input_shape is written as the [h, w, 1] it means (so readers of
/// model.json always find three numbers).
std::string model_json(const common::JsonNode& node, const ModelSpec& spec);

/// One example's size {channels, height, width} after layer l, given its size before: conv2d
/// (Keras "valid" or "same"), max pooling ("valid"), flatten and dense (n x 1 x 1); other layers
/// keep it. No checks: make_layer rejects what does not fit.
std::array<int, 3> layer_output(const LayerSpec& l, int c, int h, int w);

/// Keras "same" padding for one dimension: {before, after}.
std::pair<int, int> same_padding(int in, int kernel, int stride);

}  // namespace dtrain::nn
