// See conv2d.h.
#include "worker/spec/layers/conv2d.h"

#include <fmt/format.h>

#include <string>
#include <tuple>

namespace dtrain::nn::layers {

ConvShape conv_shape_of(const Conv2dKeys& k, Dims in) {
  ConvShape s;
  s.c = in.c, s.h = in.h, s.w = in.w, s.k = k.filters;
  s.kh = k.kernel_h, s.kw = k.kernel_w, s.sh = k.stride_h, s.sw = k.stride_w;
  if (k.same_padding) {
    std::tie(s.pad_top, s.pad_bottom) = same_padding(in.h, k.kernel_h, k.stride_h);
    std::tie(s.pad_left, s.pad_right) = same_padding(in.w, k.kernel_w, k.stride_w);
  }
  return s;
}

Dims Conv2dConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  refuse_sequence(in, where, "conv2d");
  const Dims& x = in[0];
  if (k_.same_padding)
    return {k_.filters, (x.h + k_.stride_h - 1) / k_.stride_h,
            (x.w + k_.stride_w - 1) / k_.stride_w};
  if (k_.kernel_h > x.h || k_.kernel_w > x.w) {
    throw common::ConfigError(fmt::format("{}: a {}x{} kernel does not fit the {}x{} input", where,
                                          k_.kernel_h, k_.kernel_w, x.h, x.w));
  }
  return {k_.filters, (x.h - k_.kernel_h) / k_.stride_h + 1, (x.w - k_.kernel_w) / k_.stride_w + 1};
}

bool Conv2dConfig::gpu_tested() const {
  Eltwise f;
  return !eltwise_of(k_.activation, &f) && !k_.regularized();
}

LayerCost Conv2dConfig::cost(const std::vector<Dims>& in) const {
  Dims out = output_dims(in, "");
  LayerCost cost;
  cost.conv_output = out.size();
  cost.conv = conv_shape_of(k_, in[0]);
  cost.macs = static_cast<double>(out.size()) * in[0].c * k_.kernel_h * k_.kernel_w;
  return cost;
}

std::unique_ptr<LayerConfig> parse_conv2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "filters", "kernel_size", "strides", "padding",
                   "activation", "use_bias", "kernel_initializer", "kernel_regularizer",
                   "bias_regularizer"});
  Conv2dKeys k;
  k.filters = static_cast<int>(node.at("filters").as_int(1, 65536));
  std::tie(k.kernel_h, k.kernel_w) = int_or_pair(node.at("kernel_size"), 1, 64);
  if (auto n = node.find("strides")) std::tie(k.stride_h, k.stride_w) = int_or_pair(*n, 1, 64);
  if (auto n = node.find("padding")) {
    std::string padding = n->as_string();
    if (padding != "valid" && padding != "same")
      n->fail(fmt::format("expected \"valid\" or \"same\", found \"{}\"", padding));
    k.same_padding = padding == "same";
  }
  if (auto n = node.find("use_bias")) k.use_bias = n->as_bool();
  if (auto n = node.find("kernel_initializer")) k.init = parse_initializer(*n);
  if (auto n = node.find("kernel_regularizer")) k.kernel_regularizer = parse_regularizer(*n);
  if (auto n = node.find("bias_regularizer")) k.bias_regularizer = parse_regularizer(*n);
  if (auto n = node.find("activation")) {
    k.activation = parse_activation(*n);
    if (k.activation == Activation::kSoftmax) n->fail("softmax only on a dense layer");
  }
  return std::make_unique<Conv2dConfig>(k);
}

// Keras's Conv2D.get_config() (keras/src/layers/convolutional/base_conv.py): data_format,
// dilation_rate, groups, the initializers and the rest at the values this layer computes.
std::vector<KerasKeySpec> keras_keys_conv2d() {
  return {{"filters", KerasKey::kRead},
          {"kernel_size", KerasKey::kRead},
          {"strides", KerasKey::kRead},
          {"padding", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast},
          {"dilation_rate", KerasKey::kOne},
          {"groups", KerasKey::kOne},
          {"activation", KerasKey::kActivation},
          {"use_bias", KerasKey::kRead},
          {"kernel_initializer", KerasKey::kInitializer},
          {"bias_initializer", KerasKey::kZeros},
          {"kernel_regularizer", KerasKey::kRegularizer},
          {"bias_regularizer", KerasKey::kRegularizer},
          {"kernel_constraint", KerasKey::kNull},
          {"bias_constraint", KerasKey::kNull},
          {"lora_rank", KerasKey::kNull},
          {"lora_alpha", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
