// See model_spec.h.
#include "worker/nn/model_spec.h"

#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/backend.h"

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

constexpr std::pair<LayerType, const char*> kLayerTypes[] = {
    {LayerType::kConv2d, "conv2d"},   {LayerType::kMaxPooling2d, "max_pooling2d"},
    {LayerType::kFlatten, "flatten"}, {LayerType::kDense, "dense"},
    {LayerType::kDropout, "dropout"}, {LayerType::kRelu, "relu"}};

LayerType parse_layer_type(const common::JsonNode& node) {
  std::string name = node.as_string();
  for (const auto& [type, type_name] : kLayerTypes) {
    if (name == type_name) return type;
  }
  node.fail(
      fmt::format("unknown layer type \"{}\" (expected conv2d, max_pooling2d, flatten, dense, "
                  "dropout or relu)",
                  name));
}

void parse_conv2d(const common::JsonNode& node, LayerSpec& l) {
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
}

void parse_max_pooling2d(const common::JsonNode& node, LayerSpec& l) {
  node.check_keys({"type", "pool_size", "strides", "padding"});
  if (auto n = node.find("pool_size")) std::tie(l.pool_h, l.pool_w) = int_or_pair(*n, 1, 64);
  std::tie(l.stride_h, l.stride_w) = std::pair{l.pool_h, l.pool_w};  // Keras: pool_size
  if (auto n = node.find("strides"); n && !n->is_null())
    std::tie(l.stride_h, l.stride_w) = int_or_pair(*n, 1, 64);
  if (auto n = node.find("padding"); n && n->as_string() != "valid")
    n->fail("only \"valid\" padding is supported for pooling");
}

LayerSpec parse_layer(const common::JsonNode& node) {
  LayerSpec l;
  l.type = parse_layer_type(node.at("type"));
  switch (l.type) {
    case LayerType::kConv2d:
      parse_conv2d(node, l);
      break;
    case LayerType::kMaxPooling2d:
      parse_max_pooling2d(node, l);
      break;
    case LayerType::kDense:
      node.check_keys({"type", "units", "activation", "use_bias"});
      l.units = static_cast<int>(node.at("units").as_int(1, 1 << 20));
      if (auto n = node.find("use_bias"); n && !n->as_bool())
        n->fail("use_bias false is not supported");
      break;
    case LayerType::kDropout:
      node.check_keys({"type", "rate"});
      l.rate = static_cast<float>(node.at("rate").as_number(0.0, 0.999));
      break;
    case LayerType::kFlatten:
      node.check_keys({"type"});
      break;
    case LayerType::kRelu:
      node.check_keys({"type"});
      l.activation = Activation::kRelu;
      break;
  }
  if (auto n = node.find("activation")) l.activation = parse_activation(*n);
  if (l.activation == Activation::kSoftmax && l.type != LayerType::kDense)
    node.at("activation").fail("softmax only on a dense layer");
  return l;
}

}  // namespace

ModelSpec parse_model_spec(const common::JsonNode& node) {
  node.check_keys({"input_shape", "layers"});
  ModelSpec spec;
  std::vector<common::JsonNode> shape = node.at("input_shape").as_array();
  if (shape.size() != 2 && shape.size() != 3)
    node.at("input_shape").fail("expected [height, width, channels] or [height, width]");
  spec.height = static_cast<int>(shape[0].as_int(1, 1 << 14));
  spec.width = static_cast<int>(shape[1].as_int(1, 1 << 14));
  spec.channels = shape.size() == 3 ? static_cast<int>(shape[2].as_int(1, 1 << 14)) : 1;
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

std::string model_json(const common::JsonNode& node, const ModelSpec& spec) {
  if (node.at("input_shape").as_array().size() == 3) return node.dump();  // as given: old
  common::JsonWriter w;  // checkpoints keep matching
  w.begin_object().key("input_shape").begin_array();
  w.value(spec.height).value(spec.width).value(spec.channels).end_array();
  return w.key("layers").raw(node.at("layers").dump()).end_object().str();
}

const char* math_mode_name(MathMode mode) {
  switch (mode) {
    case MathMode::kFloat32:
      return "float32";
    case MathMode::kTf32:
      return "tf32";
    case MathMode::kBfloat16:
      return "mixed_bfloat16";
    case MathMode::kFloat16:
      return "mixed_float16";
  }
  return "?";
}

const char* layer_type_name(LayerType type) {
  for (const auto& [known, name] : kLayerTypes) {
    if (known == type) return name;
  }
  return "?";
}

std::array<int, 3> layer_output(const LayerSpec& l, int c, int h, int w) {
  switch (l.type) {
    case LayerType::kConv2d:
      if (l.same_padding)
        return {l.filters, (h + l.stride_h - 1) / l.stride_h, (w + l.stride_w - 1) / l.stride_w};
      return {l.filters, (h - l.kernel_h) / l.stride_h + 1, (w - l.kernel_w) / l.stride_w + 1};
    case LayerType::kMaxPooling2d:
      return {c, (h - l.pool_h) / l.stride_h + 1, (w - l.pool_w) / l.stride_w + 1};
    case LayerType::kFlatten:
      return {c * h * w, 1, 1};
    case LayerType::kDense:
      return {l.units, 1, 1};
    default:
      return {c, h, w};
  }
}

std::pair<int, int> same_padding(int in, int kernel, int stride) {
  int out = (in + stride - 1) / stride;
  int total = std::max((out - 1) * stride + kernel - in, 0);
  return {total / 2, total - total / 2};
}

}  // namespace dtrain::nn
