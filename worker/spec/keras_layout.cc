// See keras_layout.h. Keras's side (keras-team/keras 3.16): Flatten keeps a channels-last map's
// (h, w, c) order; Dense's kernel rows follow its input's features in that order.
#include "worker/spec/keras_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "common/errors.h"
#include "worker/spec/layer_registry.h"

namespace dtrain::train {
namespace {

bool is_one_of(const std::string& type, std::initializer_list<const char*> types) {
  for (const char* t : types) {
    if (type == t) return true;
  }
  return false;
}

// Kinds whose outputs are laid out as Keras's would be, whatever their shape: those that take
// feature maps and keep no flat order (an input with one is not Keras's model), and reshape,
// which reads and writes Keras's channels-last order of the values itself.
bool keeps_keras_order(const std::string& type) {
  return is_one_of(
      type, {"conv2d", "max_pooling2d", "average_pooling2d", "global_average_pooling2d",
             "zero_padding2d", "random_crop", "random_flip", "random_translation", "reshape"});
}

// Kinds applied feature by feature (a number per layer, or per feature as its weights): the
// flat order passes through them.
bool is_elementwise(const std::string& type) {
  return is_one_of(type, {"dropout", "relu", "activation", "batch_normalization", "rescaling",
                          "layer_normalization"});
}

[[noreturn]] void refuse(const nn::NodeSpec& node, const std::string& why) {
  throw common::ConfigError(
      fmt::format("layer \"{}\" ({}): {}; dtrain cannot write it in "
                  "Keras's channels-last layout (model.keras)",
                  node.name, keras_class(node), why));
}

// Flattening a c x h x w map: Keras's (h, w, c) order in terms of dtrain's (c, h, w).
FeatureOrder flatten_order(const nn::Dims& d) {
  if (d.c == 1 || d.flat()) return nullptr;
  auto order = std::make_shared<std::vector<uint32_t>>(d.size());
  size_t k = 0;
  for (int y = 0; y < d.h; ++y)
    for (int x = 0; x < d.w; ++x)
      for (int c = 0; c < d.c; ++c) (*order)[k++] = static_cast<uint32_t>((c * d.h + y) * d.w + x);
  return order;
}

bool same(const FeatureOrder& a, const FeatureOrder& b) {
  return a == b || (a && b && *a == *b);
}

// Concatenated flat inputs: each one's order, shifted past the features before it.
FeatureOrder concatenated(const std::vector<FeatureOrder>& ins, const std::vector<nn::Dims>& dims) {
  auto order = std::make_shared<std::vector<uint32_t>>();
  uint32_t offset = 0;
  for (size_t i = 0; i < ins.size(); ++i) {
    for (uint32_t k = 0; k < dims[i].size(); ++k)
      order->push_back(offset + (ins[i] ? (*ins[i])[k] : k));
    offset += static_cast<uint32_t>(dims[i].size());
  }
  return order;
}

// Node i's output order from its inputs' (ins); throws for what Keras's model cannot match.
FeatureOrder output_order(const nn::ModelSpec& spec, size_t i,
                          const std::vector<FeatureOrder>& ins) {
  const nn::NodeSpec& node = spec.nodes[i];
  const std::vector<nn::Dims> dims = spec.input_dims_of(i);
  const bool ordered = std::any_of(ins.begin(), ins.end(), [](auto& o) { return o != nullptr; });
  if (node.type == "flatten") return ins[0] ? ins[0] : flatten_order(dims[0]);
  if (node.type == "dense") return nullptr;  // its kernel's rows take Keras's order
  if (is_elementwise(node.type)) return ins[0];
  if (node.type == "add") {
    for (const FeatureOrder& o : ins) {
      if (!same(o, ins[0])) refuse(node, "it adds features that Keras orders differently");
    }
    return ins[0];
  }
  if (node.type == "concatenate" && ordered && node.out.flat()) return concatenated(ins, dims);
  if (ordered) refuse(node, "it comes after a Flatten of a feature map");
  // A kind not listed here that turns a map into features, or features into a map: its order
  // of a map's values may be dtrain's (c, h, w), which Keras's weights would not see.
  const nn::Dims& in = dims[0];
  const nn::Dims& map = in.flat() ? node.out : in;
  if (!keeps_keras_order(node.type) && node.type != "concatenate" && in.size() == node.out.size() &&
      in.flat() != node.out.flat() && map.c > 1)
    refuse(node, "dtrain does not know in which order it lays out a feature map's values");
  return nullptr;
}

}  // namespace

std::string keras_class(const nn::NodeSpec& node) {
  const nn::LayerKind* kind = nn::find_layer_kind(node.type);
  DT_ENFORCE(kind, "layer type {}", node.type);
  return kind->keras_class;
}

std::vector<FeatureOrder> keras_input_orders(const nn::ModelSpec& spec) {
  std::vector<FeatureOrder> out(spec.nodes.size()), in(spec.nodes.size());
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    std::vector<FeatureOrder> ins;
    for (size_t j : spec.nodes[i].inputs)
      ins.push_back(j == nn::NodeSpec::kModelInput ? nullptr : out[j]);
    in[i] = ins.empty() ? nullptr : ins[0];
    out[i] = output_order(spec, i, ins);
  }
  return in;
}

void check_keras_layout(const nn::ModelSpec& spec) {
  keras_input_orders(spec);
}

}  // namespace dtrain::train
