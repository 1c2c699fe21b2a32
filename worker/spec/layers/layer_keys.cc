// See layer_keys.h.
#include "worker/spec/layers/layer_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace dtrain::nn::layers {

void refuse_sequence(const std::vector<Dims>& in, const std::string& where, const char* type) {
  for (const Dims& d : in) {
    if (!d.sequence) continue;
    throw common::ConfigError(
        fmt::format("{}: {} does not take a sequence ({} positions of {} features); it reads "
                    "images or channels (sequences go through embedding, dense, "
                    "layer_normalization, the elementwise layers and flatten)",
                    where, type, d.h, d.w));
  }
}

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
  if (name == "sigmoid") return Activation::kSigmoid;
  if (name == "tanh") return Activation::kTanh;
  if (name == "gelu") return Activation::kGelu;
  if (name == "silu" || name == "swish") return Activation::kSwish;
  node.fail(fmt::format(
      "activation \"{}\" is not supported (expected linear, relu, softmax, sigmoid, tanh, gelu, "
      "silu or swish)",
      name));
}

bool eltwise_of(Activation activation, Eltwise* f) {
  switch (activation) {
    case Activation::kSigmoid:
      return *f = Eltwise::kSigmoid, true;
    case Activation::kTanh:
      return *f = Eltwise::kTanh, true;
    case Activation::kGelu:
      return *f = Eltwise::kGelu, true;
    case Activation::kSwish:
      return *f = Eltwise::kSwish, true;
    default:
      return false;
  }
}

std::pair<int, int> same_padding(int in, int kernel, int stride) {
  int out = (in + stride - 1) / stride;
  int total = std::max((out - 1) * stride + kernel - in, 0);
  return {total / 2, total - total / 2};
}

PoolKeys parse_pool_keys(const common::JsonNode& node, bool pool_size_required) {
  PoolKeys k;
  if (pool_size_required)
    std::tie(k.pool_h, k.pool_w) = int_or_pair(node.at("pool_size"), 1, 64);
  else if (auto n = node.find("pool_size"))
    std::tie(k.pool_h, k.pool_w) = int_or_pair(*n, 1, 64);
  std::tie(k.stride_h, k.stride_w) = std::pair{k.pool_h, k.pool_w};  // Keras: pool_size
  if (auto n = node.find("strides"); n && !n->is_null())
    std::tie(k.stride_h, k.stride_w) = int_or_pair(*n, 1, 64);
  if (auto n = node.find("padding")) {
    std::string padding = n->as_string();
    if (padding != "valid" && padding != "same")
      n->fail(fmt::format("expected \"valid\" or \"same\", found \"{}\"", padding));
    k.same = padding == "same";
  }
  return k;
}

Dims pool_output_dims(const PoolKeys& k, const Dims& x, const std::string& where) {
  refuse_sequence({x}, where, "pooling");
  if (k.same)
    return {x.c, (x.h + k.stride_h - 1) / k.stride_h, (x.w + k.stride_w - 1) / k.stride_w};
  if (k.pool_h > x.h || k.pool_w > x.w) {
    throw common::ConfigError(fmt::format("{}: a {}x{} pool does not fit the {}x{} input", where,
                                          k.pool_h, k.pool_w, x.h, x.w));
  }
  return {x.c, (x.h - k.pool_h) / k.stride_h + 1, (x.w - k.pool_w) / k.stride_w + 1};
}

namespace {

struct InitializerName {
  Initializer init;
  const char* name;        ///< Keras's string form
  const char* class_name;  ///< Keras's class
};
constexpr InitializerName kInitializers[] = {
    {Initializer::kGlorotUniform, "glorot_uniform", "GlorotUniform"},
    {Initializer::kGlorotNormal, "glorot_normal", "GlorotNormal"},
    {Initializer::kHeNormal, "he_normal", "HeNormal"},
    {Initializer::kHeUniform, "he_uniform", "HeUniform"},
    {Initializer::kLecunNormal, "lecun_normal", "LecunNormal"},
    {Initializer::kLecunUniform, "lecun_uniform", "LecunUniform"}};

}  // namespace

Regularizer parse_regularizer(const common::JsonNode& node) {
  if (node.is_null()) return {};
  std::string name;
  std::optional<common::JsonNode> config;
  if (node.is_string()) {
    name = node.as_string();
  } else {
    if (!node.is_object())
      node.fail(fmt::format("expected a regularizer's name or object, found {}", node.describe()));
    node.check_keys({"module", "class_name", "config", "registered_name"});
    if (auto module = node.find("module")) {
      std::string m = module->as_string();
      if (m != "keras" && m.rfind("keras.", 0) != 0)
        module->fail(fmt::format("\"{}\" is not Keras's own: a custom regularizer", m));
    }
    if (auto r = node.find("registered_name");
        r && !r->is_null() && r->as_string() != node.at("class_name").as_string())
      r->fail("a registered custom regularizer is not supported");
    name = node.at("class_name").as_string();
    config = node.find("config");
  }
  Regularizer r;
  bool l1 = false, l2 = false;
  if (name == "L1" || name == "l1") {
    r.l1 = 0.01f, l1 = true;
  } else if (name == "L2" || name == "l2") {
    r.l2 = 0.01f, l2 = true;
  } else if (name == "L1L2" || name == "l1_l2" || name == "l1l2") {
    l1 = l2 = true;  // Keras's L1L2(): 0 and 0
  } else {
    (node.is_string() ? node : node.at("class_name"))
        .fail(fmt::format("regularizer {} is not supported (dtrain has L1, L2 and L1L2)", name));
  }
  if (config && !config->is_null()) {
    if (l1 && l2)
      config->check_keys({"l1", "l2"});
    else
      config->check_keys({l1 ? "l1" : "l2"});
    // Keras's validate_float_arg: a non-negative finite number (null: L1's and L2's default).
    if (auto n = config->find("l1"); n && !n->is_null())
      r.l1 = static_cast<float>(n->as_number(0, 1e30));
    if (auto n = config->find("l2"); n && !n->is_null())
      r.l2 = static_cast<float>(n->as_number(0, 1e30));
  }
  return r;
}

Initializer parse_initializer(const common::JsonNode& node) {
  std::string name;
  if (node.is_string()) {
    name = node.as_string();
    for (const InitializerName& i : kInitializers)
      if (name == i.name || name == i.class_name) return i.init;
  } else {
    node.check_keys({"module", "class_name", "config", "registered_name"});
    name = node.at("class_name").as_string();
    if (auto config = node.find("config")) {  // Keras 3: seed, input_axes, output_axes
      config->check_keys({"seed", "input_axes", "output_axes"});
      if (auto seed = config->find("seed"); seed && !seed->is_null())
        seed->as_int(INT64_MIN, INT64_MAX);
      for (const char* axes : {"input_axes", "output_axes"}) {
        if (auto n = config->find(axes); n && !n->is_null())
          n->fail("dtrain computes the kernel's own fans: null");
      }
    }
    for (const InitializerName& i : kInitializers)
      if (name == i.class_name) return i.init;
  }
  std::string known;
  for (const InitializerName& i : kInitializers)
    known += std::string(known.empty() ? "" : ", ") + i.name;
  node.fail(fmt::format("initializer {} is not supported (dtrain has {})", name, known));
}

// embeddings_initializer: Keras's "uniform" (or "random_uniform", "RandomUniform"), or its
// serialized RandomUniform with minval < maxval and any seed (dtrain draws from train.seed).
UniformRange parse_uniform_initializer(const common::JsonNode& node) {
  UniformRange k;
  const char* why = "dtrain computes RandomUniform (Keras's \"uniform\", the default)";
  if (node.is_string()) {
    const std::string name = node.as_string();
    if (name != "uniform" && name != "random_uniform" && name != "RandomUniform")
      node.fail(fmt::format("\"{}\" is not supported ({})", name, why));
    return k;
  }
  if (!node.is_object())
    node.fail(fmt::format("expected an initializer's name or object, found {}", node.describe()));
  node.check_keys({"module", "class_name", "config", "registered_name"});
  if (auto module = node.find("module")) {
    const std::string m = module->as_string();
    if (m != "keras" && m.rfind("keras.", 0) != 0)
      module->fail(fmt::format("\"{}\" is not Keras's own: a custom initializer", m));
  }
  const common::JsonNode class_name = node.at("class_name");
  if (class_name.as_string() != "RandomUniform")
    class_name.fail(fmt::format("{} is not supported ({})", class_name.as_string(), why));
  if (auto r = node.find("registered_name");
      r && !r->is_null() && r->as_string() != "RandomUniform")
    r->fail("a registered custom initializer is not supported");
  auto config = node.find("config");
  if (!config || config->is_null()) return k;
  config->check_keys({"minval", "maxval", "seed"});
  if (auto seed = config->find("seed"); seed && !seed->is_null())
    seed->as_int(INT64_MIN, INT64_MAX);
  if (auto n = config->find("minval")) k.minval = static_cast<float>(n->as_number(-1e6, 1e6));
  if (auto n = config->find("maxval")) k.maxval = static_cast<float>(n->as_number(-1e6, 1e6));
  if (!(k.minval < k.maxval))
    config->fail(fmt::format("minval {} is not below maxval {}", k.minval, k.maxval));
  return k;
}

}  // namespace dtrain::nn::layers
