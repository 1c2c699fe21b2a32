// See multi_head_attention.h.
#include "worker/spec/layers/multi_head_attention.h"

#include <fmt/format.h>

#include <string>

namespace dtrain::nn::layers {

Dims MultiHeadAttentionConfig::output_dims(const std::vector<Dims>& in,
                                           const std::string& where) const {
  const Dims& x = in[0];
  if (!x.sequence || x.c != 1) {
    throw common::ConfigError(fmt::format(
        "{}: multi_head_attention takes a sequence (positions x features), not a {}x{}x{} "
        "input",
        where, x.h, x.w, x.c));
  }
  return x;
}

LayerCost MultiHeadAttentionConfig::cost(const std::vector<Dims>& in) const {
  const double t = in[0].h, d = in[0].w, hk = k_.heads * k_.key_dim, hv = k_.heads * k_.value();
  LayerCost c;
  // The four projections, then the scores and the weighted sum (all keys, mask or not).
  c.macs = t * d * (2 * hk + 2 * hv) + t * t * (hk + hv);
  const int rows = in[0].h, di = in[0].w, ik = static_cast<int>(hk), iv = static_cast<int>(hv);
  c.more_matmuls = {{di, ik, rows}, {di, ik, rows}, {di, iv, rows}, {iv, di, rows}};
  c.attention.t = in[0].h, c.attention.heads = k_.heads, c.attention.key_dim = k_.key_dim;
  c.attention.value_dim = k_.value(), c.attention.causal = k_.causal;
  return c;
}

std::unique_ptr<LayerConfig> parse_multi_head_attention(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "num_heads", "key_dim", "value_dim", "use_bias",
                   "causal", "use_causal_mask", "dropout", "kernel_initializer",
                   "bias_initializer"});
  AttentionKeys k;
  k.heads = static_cast<int>(node.at("num_heads").as_int(1, 4096));
  k.key_dim = static_cast<int>(node.at("key_dim").as_int(1, 1 << 16));
  if (auto n = node.find("value_dim"); n && !n->is_null())
    k.value_dim = static_cast<int>(n->as_int(1, 1 << 16));
  if (auto n = node.find("use_bias")) k.use_bias = n->as_bool();
  // The job file's "causal"; a Keras node's call argument use_causal_mask arrives as that key.
  for (const char* key : {"causal", "use_causal_mask"})
    if (auto n = node.find(key)) k.causal = n->as_bool();
  if (auto n = node.find("dropout")) {
    k.dropout = static_cast<float>(n->as_number(0, 1));
    if (k.dropout >= 1) n->fail("expected a rate in [0, 1)");
  }
  if (auto n = node.find("kernel_initializer"))
    if (parse_initializer(*n) != Initializer::kGlorotUniform)
      n->fail("multi_head_attention's kernels are glorot_uniform (Keras's default)");
  if (auto n = node.find("bias_initializer"); n && (!n->is_string() || n->as_string() != "zeros"))
    n->fail("multi_head_attention's biases are zeros (Keras's default)");
  return std::make_unique<MultiHeadAttentionConfig>(k);
}

// Keras's MultiHeadAttention.get_config() (keras/src/layers/attention/multi_head_attention.py).
std::vector<KerasKeySpec> keras_keys_multi_head_attention() {
  return {{"num_heads", KerasKey::kRead},         {"key_dim", KerasKey::kRead},
          {"value_dim", KerasKey::kRead},         {"dropout", KerasKey::kRead},
          {"use_bias", KerasKey::kRead},          {"use_gate", KerasKey::kFalse},
          {"output_shape", KerasKey::kNull},      {"attention_axes", KerasKey::kSequenceAxis},
          {"sliding_window", KerasKey::kNull},    {"kernel_initializer", KerasKey::kGlorotUniform},
          {"bias_initializer", KerasKey::kZeros}, {"kernel_regularizer", KerasKey::kNull},
          {"bias_regularizer", KerasKey::kNull},  {"kernel_constraint", KerasKey::kNull},
          {"bias_constraint", KerasKey::kNull},   {"seed", KerasKey::kSeed}};
}

// MultiHeadAttention.call(query, value, key=None, query_mask=None, value_mask=None,
// key_mask=None, attention_mask=None, return_attention_scores=False, training=None,
// use_causal_mask=False), after its query: self-attention only (value and key the query's
// tensor), no masks but the causal one, which the parse reads as use_causal_mask.
std::vector<KerasArgSpec> keras_call_multi_head_attention() {
  return {{"value", KerasArg::kSameTensor},
          {"key", KerasArg::kSameTensor},
          {"query_mask", KerasArg::kNull},
          {"value_mask", KerasArg::kNull},
          {"key_mask", KerasArg::kNull},
          {"attention_mask", KerasArg::kNull},
          {"return_attention_scores", KerasArg::kFalse},
          {"training", KerasArg::kNull},
          {"use_causal_mask", KerasArg::kFlag}};
}

}  // namespace dtrain::nn::layers
