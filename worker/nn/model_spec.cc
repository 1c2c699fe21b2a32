// See model_spec.h.
#include "worker/nn/model_spec.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace dtrain::nn {
namespace {

// Keras accepts an int or a pair for sizes and strides.
std::pair<int, int> int_or_pair(const common::JsonNode& node, int min, int max) {
  if (!node.is_array()) {
    int v = static_cast<int>(node.as_int(min, max));
    return {v, v};
  }
  std::vector<common::JsonNode> items = node.as_array();
  if (items.size() != 2)
    node.fail(fmt::format("expected an integer or a pair, found {}", node.describe()));
  return {static_cast<int>(items[0].as_int(min, max)), static_cast<int>(items[1].as_int(min, max))};
}

Activation parse_activation(const common::JsonNode& node) {
  if (node.is_null()) return Activation::kLinear;
  std::string name = node.as_string();
  if (name == "linear") return Activation::kLinear;
  if (name == "relu") return Activation::kRelu;
  if (name == "softmax") return Activation::kSoftmax;
  node.fail(
      fmt::format("activation \"{}\" is not supported (expected relu, softmax or linear)", name));
}

LayerSpec parse_layer(const common::JsonNode& node) {
  LayerSpec l;
  l.type = node.at("type").as_string();
  if (l.type == "conv2d") {
    node.check_keys(
        {"type", "filters", "kernel_size", "strides", "padding", "activation", "use_bias"});
    l.filters = static_cast<int>(node.at("filters").as_int(1, 65536));
    std::tie(l.kernel_h, l.kernel_w) = int_or_pair(node.at("kernel_size"), 1, 64);
    if (auto n = node.find("strides")) std::tie(l.stride_h, l.stride_w) = int_or_pair(*n, 1, 64);
    if (auto n = node.find("padding")) {
      std::string padding = n->as_string();
      if (padding != "valid" && padding != "same")
        n->fail(fmt::format("expected \"valid\" or \"same\", found \"{}\"", padding));
      l.same_padding = padding == "same";
    }
    if (auto n = node.find("use_bias"); n && !n->as_bool())
      n->fail("use_bias false is not supported");
  } else if (l.type == "max_pooling2d") {
    node.check_keys({"type", "pool_size", "strides", "padding"});
    if (auto n = node.find("pool_size")) std::tie(l.pool_h, l.pool_w) = int_or_pair(*n, 1, 64);
    std::tie(l.stride_h, l.stride_w) =
        std::pair{l.pool_h, l.pool_w};  // Keras: strides default to pool_size
    if (auto n = node.find("strides"); n && !n->is_null())
      std::tie(l.stride_h, l.stride_w) = int_or_pair(*n, 1, 64);
    if (auto n = node.find("padding"); n && n->as_string() != "valid")
      n->fail("only \"valid\" padding is supported for pooling");
  } else if (l.type == "dense") {
    node.check_keys({"type", "units", "activation", "use_bias"});
    l.units = static_cast<int>(node.at("units").as_int(1, 1 << 20));
    if (auto n = node.find("use_bias"); n && !n->as_bool())
      n->fail("use_bias false is not supported");
  } else if (l.type == "dropout") {
    node.check_keys({"type", "rate"});
    l.rate = static_cast<float>(node.at("rate").as_number(0.0, 0.999));
  } else if (l.type == "flatten" || l.type == "relu") {
    node.check_keys({"type"});
    if (l.type == "relu") l.activation = Activation::kRelu;
  } else {
    node.at("type").fail(
        fmt::format("unknown layer type \"{}\" (expected conv2d, max_pooling2d, flatten, "
                    "dense, dropout or relu)",
                    l.type));
  }
  if (auto n = node.find("activation")) l.activation = parse_activation(*n);
  if (l.activation == Activation::kSoftmax && l.type != "dense")
    node.at("activation").fail("softmax only on a dense layer");
  return l;
}

}  // namespace

ModelSpec parse_model_spec(const common::JsonNode& node) {
  node.check_keys({"input_shape", "layers"});
  ModelSpec spec;
  std::vector<common::JsonNode> shape = node.at("input_shape").as_array();
  if (shape.size() != 3) node.at("input_shape").fail("expected [height, width, channels]");
  spec.height = static_cast<int>(shape[0].as_int(1, 1 << 14));
  spec.width = static_cast<int>(shape[1].as_int(1, 1 << 14));
  spec.channels = static_cast<int>(shape[2].as_int(1, 1 << 14));
  std::vector<common::JsonNode> layers = node.at("layers").as_array();
  if (layers.empty()) node.at("layers").fail("expected at least one layer");
  for (const common::JsonNode& layer : layers) spec.layers.push_back(parse_layer(layer));
  for (size_t i = 0; i + 1 < spec.layers.size(); ++i) {
    if (spec.layers[i].activation == Activation::kSoftmax) {
      layers[i].fail("softmax is only supported as the last layer's activation");
    }
  }
  return spec;
}

std::pair<int, int> same_padding(int in, int kernel, int stride) {
  int out = (in + stride - 1) / stride;
  int total = std::max((out - 1) * stride + kernel - in, 0);
  return {total / 2, total - total / 2};
}

}  // namespace dtrain::nn
