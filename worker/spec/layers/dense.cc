// See dense.h.
#include "worker/spec/layers/dense.h"

#include <fmt/format.h>

namespace dtrain::nn::layers {

Dims DenseConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  if (in[0].sequence) return {1, in[0].h, k_.units, true};  // each position
  if (!in[0].flat()) {
    throw common::ConfigError(
        fmt::format("{}: dense needs flat input ({}x{}x{}); add a flatten layer before it", where,
                    in[0].h, in[0].w, in[0].c));
  }
  return {k_.units, 1, 1};
}

bool DenseConfig::gpu_tested() const {
  Eltwise f;
  return !eltwise_of(k_.activation, &f) && !k_.regularized();
}

LayerCost DenseConfig::cost(const std::vector<Dims>& in) const {
  LayerCost cost;
  cost.matmul_in = static_cast<int>(in[0].sequence ? in[0].w : in[0].size());
  cost.matmul_out = k_.units;
  cost.matmul_rows = in[0].positions();
  cost.macs = static_cast<double>(in[0].size()) * k_.units;  // every position's
  return cost;
}

std::unique_ptr<LayerConfig> parse_dense(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "units", "activation", "use_bias",
                   "kernel_initializer", "kernel_regularizer", "bias_regularizer"});
  DenseKeys k;
  k.units = static_cast<int>(node.at("units").as_int(1, 1 << 20));
  if (auto n = node.find("use_bias")) k.use_bias = n->as_bool();
  if (auto n = node.find("kernel_initializer")) k.init = parse_initializer(*n);
  if (auto n = node.find("kernel_regularizer")) k.kernel_regularizer = parse_regularizer(*n);
  if (auto n = node.find("bias_regularizer")) k.bias_regularizer = parse_regularizer(*n);
  if (auto n = node.find("activation")) k.activation = parse_activation(*n);
  return std::make_unique<DenseConfig>(k);
}

// Keras's Dense.get_config() (keras/src/layers/core/dense.py): the initializers and the rest
// at the values this layer computes.
std::vector<KerasKeySpec> keras_keys_dense() {
  return {{"units", KerasKey::kRead},
          {"activation", KerasKey::kActivation},
          {"use_bias", KerasKey::kRead},
          {"kernel_initializer", KerasKey::kInitializer},
          {"bias_initializer", KerasKey::kZeros},
          {"kernel_regularizer", KerasKey::kRegularizer},
          {"bias_regularizer", KerasKey::kRegularizer},
          {"kernel_constraint", KerasKey::kNull},
          {"bias_constraint", KerasKey::kNull},
          {"quantization_config", KerasKey::kNull},
          {"lora_rank", KerasKey::kNull},
          {"lora_alpha", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
