// See keras_archive.h. Keras's side, read from keras-team/keras 3.16: saving/saving_lib.py (the
// zip's members; _save_state: a "vars" group per saveable with a "name" attribute, the model's
// own at the root, each of model.layers under layers/<snake case of its class, made unique in
// order>, datasets "0", "1", ... in the layer's trainable then non-trainable order),
// utils/naming.py (to_snake_case), models/sequential.py (layers without the InputLayer),
// ops/function.py (map_graph: a Functional's layers, its InputLayer among them, by depth from
// the output, ties in the order a depth-first walk from the output first meets them), and each
// layer's build() (Conv2D kernel [kh, kw, in, out] then bias, Dense kernel [in, out] then bias,
// BatchNormalization gamma, beta, moving_mean, moving_variance, LayerNormalization gamma, beta,
// those it has; Embedding's embeddings). Layers made of sublayers (MultiHeadAttention's
// EinsumDense projections, keras_hub's TokenAndPositionEmbedding's two tables): saving_lib's
// _walk_saveable, each sublayer under the attribute it meets first (var_groups below).
#include "worker/train/keras_archive.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "worker/spec/keras_layout.h"
#include "worker/spec/layer_registry.h"
#include "worker/train/hdf5_image.h"
#include "worker/train/zip_writer.h"

namespace dtrain::train {
namespace {

constexpr const char* kKerasVersion = "3.16.0";  // the release whose saving_lib this follows

// Keras's naming.to_snake_case: "GlobalAveragePooling2D" is "global_average_pooling2d".
std::string snake_case(const std::string& class_name) {
  static const std::regex word("(.)([A-Z][a-z]+)"), hump("([a-z])([A-Z])");
  std::string s = std::regex_replace(std::regex_replace(class_name, word, "$1_$2"), hump, "$1_$2");
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A Functional's layers in Keras's order (map_graph): node indices, nodes.size() for the
// InputLayer. Each dtrain layer is called once, so a layer is its one node.
std::vector<size_t> functional_order(const nn::ModelSpec& spec) {
  const size_t input = spec.nodes.size();
  auto parents = [&](size_t i) {
    std::vector<size_t> p;
    if (i == input) return p;
    for (size_t j : spec.nodes[i].inputs) p.push_back(j == nn::NodeSpec::kModelInput ? input : j);
    return p;
  };
  std::vector<int64_t> first_seen(input + 1, -1);
  std::vector<size_t> finished;  // inputs before the layers that take them
  int64_t seen = 0;
  std::function<void(size_t)> walk = [&](size_t i) {
    if (first_seen[i] >= 0) return;  // no cycles: seen means finished
    first_seen[i] = seen++;
    for (size_t j : parents(i)) walk(j);
    finished.push_back(i);
  };
  walk(input - 1);  // the output
  std::vector<int64_t> depth(input + 1, 0);
  for (auto it = finished.rbegin(); it != finished.rend(); ++it) {
    for (size_t j : parents(*it)) depth[j] = std::max(depth[j], depth[*it] + 1);
  }
  std::vector<size_t> order = finished;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return depth[a] != depth[b] ? depth[a] > depth[b] : first_seen[a] < first_seen[b];
  });
  return order;
}

// The model as Keras sees it when it saves: its name, and each of model.layers in order with
// its class and name (node null for a Functional's InputLayer).
struct KerasLayer {
  const nn::NodeSpec* node;
  size_t index;  ///< the node's index in spec.nodes
  std::string class_name, name;
};

struct KerasView {
  std::string model_name;
  std::vector<KerasLayer> layers;
};

KerasView keras_view(const std::string& keras_config, const nn::ModelSpec& spec) {
  common::JsonDocument doc = common::JsonDocument::parse(keras_config, "config.json");
  const common::JsonNode root = doc.root();
  const std::string model_class = root.at("class_name").as_string();
  const common::JsonNode config = root.at("config");
  KerasView view;
  const bool functional = model_class == "Functional";
  DT_ENFORCE(functional || model_class == "Sequential", "a Keras {} model", model_class);
  auto name = config.find("name");
  view.model_name = name && name->is_string() ? name->as_string() : snake_case(model_class);
  std::string input_name = "input_layer";
  for (const common::JsonNode& entry : config.at("layers").as_array()) {
    if (entry.at("class_name").as_string() != "InputLayer") continue;
    auto n = functional ? entry.find("name") : entry.at("config").find("name");
    if (n && n->is_string()) input_name = n->as_string();
  }
  std::vector<size_t> order(spec.nodes.size());
  std::iota(order.begin(), order.end(), 0);  // a Sequential's: as listed (a chain keeps it)
  if (functional) order = functional_order(spec);
  for (size_t i : order) {
    if (i == spec.nodes.size()) {
      view.layers.push_back({nullptr, i, "InputLayer", input_name});
      continue;
    }
    const nn::NodeSpec& node = spec.nodes[i];
    view.layers.push_back({&node, i, keras_class(node), node.name});
  }
  return view;
}

// One of a layer's variables in Keras's layout.
struct Variable {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Kinds whose tensors dtrain keeps in Keras's shape and order already.
bool keeps_keras_weights(const std::string& type) {
  for (const char* kind :
       {"embedding", "position_embedding", "token_and_position_embedding", "multi_head_attention"})
    if (type == kind) return true;
  return false;
}

Variable convert(const KerasLayer& layer, const TensorView& t, const std::string& what,
                 const FeatureOrder& order) {
  const std::string& type = layer.node->type;
  Variable v{t.shape, std::vector<float>(t.data, t.data + t.count)};
  const bool per_feature = type == "batch_normalization" || type == "layer_normalization";
  if (type == "conv2d" && what == "kernel") {  // [out, in, kh, kw] -> [kh, kw, in, out]
    DT_ENFORCE_EQ(t.shape.size(), size_t{4}, "{}", t.name);
    const int64_t o = t.shape[0], c = t.shape[1], kh = t.shape[2], kw = t.shape[3];
    v.shape = {kh, kw, c, o};
    for (int64_t a = 0; a < o; ++a)
      for (int64_t b = 0; b < c; ++b)
        for (int64_t y = 0; y < kh; ++y)
          for (int64_t x = 0; x < kw; ++x)
            v.values[((y * kw + x) * c + b) * o + a] = t.data[((a * c + b) * kh + y) * kw + x];
  } else if (type == "dense" && what == "kernel" && order) {  // rows in Keras's feature order
    DT_ENFORCE(t.shape.size() == 2 && static_cast<size_t>(t.shape[0]) == order->size(), "{}",
               t.name);
    const size_t units = static_cast<size_t>(t.shape[1]);
    for (size_t k = 0; k < order->size(); ++k)
      std::copy_n(t.data + (*order)[k] * units, units, v.values.begin() + k * units);
  } else if (per_feature && order) {  // per feature, in Keras's order
    DT_ENFORCE(t.count == order->size(), "{}", t.name);
    for (size_t k = 0; k < order->size(); ++k) v.values[k] = t.data[(*order)[k]];
  } else if (type != "conv2d" && type != "dense" && !per_feature && !keeps_keras_weights(type)) {
    throw common::ConfigError(
        fmt::format("layer \"{}\" ({}): dtrain does not know Keras's layout of its weights",
                    layer.name, layer.class_name));
  }
  return v;
}

// A layer's tensors among weights (its parameters then its state: Keras's trainable then
// non-trainable order), each with its name relative to the layer ("kernel", "query.kernel"):
// those whose longest matching prefix is the layer's (a layer "a" does not take "a.b.kernel"
// of a layer "a.b").
std::vector<std::pair<const TensorView*, std::string>> tensors_of(
    const nn::ModelSpec& spec, size_t index, const std::vector<TensorView>& weights) {
  const std::string& prefix = spec.nodes[index].param_prefix;
  std::vector<std::pair<const TensorView*, std::string>> found;
  for (const TensorView& t : weights) {
    if (t.name.compare(0, prefix.size(), prefix) != 0) continue;
    const bool longer = std::any_of(spec.nodes.begin(), spec.nodes.end(), [&](const auto& n) {
      return n.param_prefix.size() > prefix.size() &&
             t.name.compare(0, n.param_prefix.size(), n.param_prefix) == 0;
    });
    if (!longer) found.emplace_back(&t, t.name.substr(prefix.size()));
  }
  return found;
}

// One HDF5 group of a layer's variables, below layers/<group>: the path saving_lib's walk
// reaches it by ("" the layer's own; a sublayer's attribute), its "name" attribute, and the
// layer's tensors it holds (names relative to the layer) in Keras's order: those the layer
// lacks (a bias without use_bias) are left out.
struct VarGroup {
  std::string path, name;
  std::vector<std::string> vars;
};

// Where Keras's saving_lib puts a layer's variables. A layer with sublayers has an empty group
// of its own and one per sublayer, under the attribute _walk_saveable meets it by first (public
// attributes sorted, then private ones): MultiHeadAttention's EinsumDense projections (query,
// key, value, attention_output, each kernel then bias) under their properties, its Softmax and
// Dropout (no variables; auto-named, as the k-th of the model's attention layers builds them);
// TokenAndPositionEmbedding's token_embedding (a ReversibleEmbedding with tied weights) and
// position_embedding. Other kinds: their own group, their tensors in order. k: how many layers
// of this one's class come before it in model.layers.
std::vector<VarGroup> var_groups(const KerasLayer& layer, int k,
                                 const std::vector<std::pair<const TensorView*, std::string>>& ts) {
  const std::string& type = layer.node->type;
  const std::string nth = k > 0 ? fmt::format("_{}", k) : "";
  if (type == "multi_head_attention") {
    auto projection = [](const char* attribute, const char* name) {
      return VarGroup{
          attribute, name, {std::string(name) + ".kernel", std::string(name) + ".bias"}};
    };
    return {{"", layer.name, {}},
            projection("key_dense", "key"),
            projection("output_dense", "attention_output"),
            projection("query_dense", "query"),
            projection("value_dense", "value"),
            {"_dropout_layer", "dropout" + nth, {}},
            {"_softmax", "softmax" + nth, {}}};
  }
  if (type == "token_and_position_embedding") {
    return {{"", layer.name, {}},
            {"position_embedding", "position_embedding", {"position_embedding.embeddings"}},
            {"token_embedding", "token_embedding", {"token_embedding.embeddings"}}};
  }
  VarGroup own{"", layer.name, {}};
  for (const auto& [tensor, what] : ts) own.vars.push_back(what);
  return {own};
}

std::string weights_file(const std::string& label, const KerasView& view, const nn::ModelSpec& spec,
                         const std::vector<TensorView>& weights) {
  const std::vector<FeatureOrder> orders = keras_input_orders(spec);
  Hdf5Image h5(label);
  h5.add_group("vars");  // the model's own (it has none), named
  h5.set_attribute("vars", "name", view.model_name);
  std::map<std::string, int> used;
  for (const KerasLayer& layer : view.layers) {
    std::string group = snake_case(layer.class_name);
    auto [it, fresh] = used.emplace(group, 0);
    const int k = fresh ? 0 : ++it->second;
    if (k > 0) group += fmt::format("_{}", k);
    group = "layers/" + group;
    const bool auto_name = !layer.node || layer.name.rfind("layers.", 0) == 0;
    if (!layer.node) {
      h5.add_group(group + "/vars");
      h5.set_attribute(group + "/vars", "name", layer.name);
      continue;
    }
    KerasLayer named = layer;
    if (auto_name) named.name = group.substr(7);
    const auto ts = tensors_of(spec, layer.index, weights);
    size_t written = 0;
    for (const VarGroup& g : var_groups(named, k, ts)) {
      const std::string vars = group + (g.path.empty() ? "" : "/" + g.path) + "/vars";
      h5.add_group(vars);
      h5.set_attribute(vars, "name", g.name);
      int i = 0;
      for (const std::string& what : g.vars) {
        auto t =
            std::find_if(ts.begin(), ts.end(), [&](const auto& p) { return p.second == what; });
        if (t == ts.end()) continue;
        Variable v = convert(named, *t->first, what, orders[layer.index]);
        h5.add_dataset(fmt::format("{}/{}", vars, i++), v.shape, v.values.data());
        ++written;
      }
    }
    DT_ENFORCE_EQ(written, ts.size(), "layer {}: tensors without a place in Keras's layout",
                  layer.name);
  }
  return h5.finish();
}

// metadata.json as Keras writes it (json.dumps's spacing).
std::string metadata_json(std::time_t saved) {
  std::tm t{};
  localtime_r(&saved, &t);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d@%H:%M:%S", &t);
  return fmt::format(R"({{"keras_version": "{}", "date_saved": "{}"}})", kKerasVersion, date);
}

}  // namespace

void write_keras_archive(const std::string& path, const std::string& keras_config,
                         const nn::ModelSpec& spec, const std::vector<TensorView>& weights,
                         std::time_t saved) {
  std::string zip;
  try {
    KerasView view = keras_view(keras_config, spec);
    std::string h5 = weights_file(path + ": model.weights.h5", view, spec, weights);
    ZipWriter writer(saved);
    writer.add("metadata.json", metadata_json(saved));
    writer.add("config.json", keras_config);
    writer.add("model.weights.h5", h5);
    zip = writer.finish();
  } catch (const common::ConfigError& e) {
    throw common::ConfigError(fmt::format("{}: {}", path, e.what()));
  }
  try {
    common::write_file_atomically(path, zip);
  } catch (const common::IoError& e) {
    throw common::IoError(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace dtrain::train
