// See model_spec.h.
#include "worker/spec/model_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/errors.h"

namespace dtrain::nn {
namespace {

constexpr const char* kInputName = "input";

// A layer as listed, before the graph is ordered.
struct Listed {
  common::JsonNode node;
  NodeSpec spec;
  std::vector<std::string> input_names;
  std::vector<common::JsonNode> input_nodes;  ///< where each input was named, for messages
};

Listed parse_listed(const common::JsonNode& node, size_t index) {
  Listed l{node, {}, {}, {}};
  common::JsonNode type = node.at("type");
  l.spec.type = type.as_string();
  const LayerKind* kind = find_layer_kind(l.spec.type);
  if (!kind) {
    std::string guess = closest_layer_type(l.spec.type);
    type.fail(fmt::format("unknown layer type \"{}\" ({}expected {})", l.spec.type,
                          guess.empty() ? "" : "did you mean \"" + guess + "\"? ",
                          layer_type_list()));
  }
  l.spec.path = node.path();
  if (auto n = node.find("name")) {
    l.spec.name = n->as_nonempty_string();
    if (l.spec.name == kInputName) n->fail("\"input\" names the model's input; choose another");
    l.spec.param_prefix = l.spec.name + ".";
  } else {
    l.spec.name = fmt::format("layers.{}.{}", index, l.spec.type);
    l.spec.param_prefix = l.spec.name + ".";
  }
  if (auto n = node.find("inputs")) {
    for (const common::JsonNode& input : n->as_array()) {
      l.input_names.push_back(input.as_nonempty_string());
      l.input_nodes.push_back(input);
    }
    if (l.input_names.empty()) n->fail("expected at least one input");
  }
  l.spec.config = kind->parse(node);
  return l;
}

// Resolves every layer's inputs to listed indices (kModelInput for "input"); the layer before
// when it names none.
std::vector<std::vector<size_t>> resolve_inputs(const std::vector<Listed>& listed) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < listed.size(); ++i) {
    auto [it, fresh] = by_name.emplace(listed[i].spec.name, i);
    if (!fresh) {
      listed[i].node.at("name").fail(fmt::format(
          "the name \"{}\" is taken by {}", listed[i].spec.name, listed[it->second].spec.path));
    }
  }
  std::vector<std::vector<size_t>> inputs(listed.size());
  for (size_t i = 0; i < listed.size(); ++i) {
    if (listed[i].input_names.empty()) {
      inputs[i] = {i == 0 ? NodeSpec::kModelInput : i - 1};
      continue;
    }
    for (size_t k = 0; k < listed[i].input_names.size(); ++k) {
      const std::string& name = listed[i].input_names[k];
      if (name == kInputName) {
        inputs[i].push_back(NodeSpec::kModelInput);
        continue;
      }
      auto it = by_name.find(name);
      if (it == by_name.end())
        listed[i].input_nodes[k].fail(fmt::format("no layer is named \"{}\"", name));
      inputs[i].push_back(it->second);
    }
  }
  return inputs;
}

// The layers the output depends on, in a topological order (among those ready, the one listed
// first goes first, so a chain keeps its order). ConfigError for a cycle or an unused layer.
std::vector<size_t> order_graph(const std::vector<Listed>& listed,
                                const std::vector<std::vector<size_t>>& inputs, size_t output) {
  const size_t n = listed.size();
  std::vector<bool> used(n, false);
  std::vector<size_t> stack = {output};
  while (!stack.empty()) {
    size_t i = stack.back();
    stack.pop_back();
    if (used[i]) continue;
    used[i] = true;
    for (size_t in : inputs[i])
      if (in != NodeSpec::kModelInput) stack.push_back(in);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!used[i]) {
      throw common::ConfigError(fmt::format("{} (\"{}\"): the output does not use this layer",
                                            listed[i].spec.path, listed[i].spec.name));
    }
  }
  std::vector<size_t> waiting(n, 0);  // inputs not yet placed
  std::vector<std::vector<size_t>> users(n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t in : inputs[i]) {
      if (in == NodeSpec::kModelInput) continue;
      ++waiting[i];
      users[in].push_back(i);
    }
  }
  std::vector<size_t> order;
  std::vector<bool> placed(n, false);
  while (order.size() < n) {
    size_t next = n;
    for (size_t i = 0; i < n && next == n; ++i)
      if (!placed[i] && waiting[i] == 0) next = i;
    if (next == n) {
      size_t stuck = 0;
      while (placed[stuck]) ++stuck;
      throw common::ConfigError(
          fmt::format("{} (\"{}\"): its inputs lead back to it (the layers form a cycle)",
                      listed[stuck].spec.path, listed[stuck].spec.name));
    }
    placed[next] = true;
    order.push_back(next);
    for (size_t user : users[next]) --waiting[user];
  }
  return order;
}

}  // namespace

std::vector<Dims> ModelSpec::input_dims_of(size_t i) const {
  std::vector<Dims> dims;
  for (size_t in : nodes[i].inputs)
    dims.push_back(in == NodeSpec::kModelInput ? input_dims() : nodes[in].out);
  return dims;
}

ModelSpec parse_model_spec(const common::JsonNode& node) {
  node.check_keys({"input_shape", "layers", "output"});
  ModelSpec spec;
  std::vector<common::JsonNode> shape = node.at("input_shape").as_array();
  if (shape.empty() || shape.size() > 3)
    node.at("input_shape")
        .fail("expected [height, width, channels], [height, width] or [sequence_length]");
  spec.height = static_cast<int>(shape[0].as_int(1, 1 << 14));
  spec.width = shape.size() > 1 ? static_cast<int>(shape[1].as_int(1, 1 << 14)) : 1;
  spec.channels = shape.size() == 3 ? static_cast<int>(shape[2].as_int(1, 1 << 14)) : 1;
  spec.sequence = shape.size() == 1;
  std::vector<common::JsonNode> layers = node.at("layers").as_array();
  if (layers.empty()) node.at("layers").fail("expected at least one layer");
  std::vector<Listed> listed;
  for (size_t i = 0; i < layers.size(); ++i) listed.push_back(parse_listed(layers[i], i));
  std::vector<std::vector<size_t>> inputs = resolve_inputs(listed);
  size_t output = listed.size() - 1;
  if (auto n = node.find("output")) {
    std::string name = n->as_nonempty_string();
    output = listed.size();
    for (size_t i = 0; i < listed.size(); ++i)
      if (listed[i].spec.name == name) output = i;
    if (output == listed.size()) n->fail(fmt::format("no layer is named \"{}\"", name));
  }
  // input_shape [n]: a sequence of n token ids when a layer reading the input embeds tokens,
  // else n features (Keras's Input(shape=(n,)) before a Dense: tabular data), a 1x1 image of n
  // channels.
  if (spec.sequence) {
    bool tokens = false;
    for (size_t i = 0; i < listed.size(); ++i) {
      const bool reads_input =
          std::find(inputs[i].begin(), inputs[i].end(), NodeSpec::kModelInput) != inputs[i].end();
      const std::string& type = listed[i].spec.type;
      tokens = tokens ||
               (reads_input && (type == "embedding" || type == "token_and_position_embedding"));
    }
    if (!tokens) {
      spec.sequence = false;
      spec.channels = spec.height;
      spec.height = 1;
    }
  }
  std::vector<size_t> order = order_graph(listed, inputs, output);
  std::vector<size_t> place(listed.size());
  for (size_t k = 0; k < order.size(); ++k) place[order[k]] = k;
  for (size_t k = 0; k < order.size(); ++k) {
    Listed& l = listed[order[k]];
    NodeSpec node_spec = l.spec;
    for (size_t in : inputs[order[k]])
      node_spec.inputs.push_back(in == NodeSpec::kModelInput ? in : place[in]);
    int arity = node_spec.config->arity();
    if (arity > 0 && node_spec.inputs.size() != static_cast<size_t>(arity)) {
      l.node.at("inputs").fail(fmt::format("{} takes {} input{}, found {}", node_spec.type, arity,
                                           arity == 1 ? "" : "s", node_spec.inputs.size()));
    }
    if (arity == 0 && node_spec.inputs.size() < 2) {
      std::string where = l.node.find("inputs") ? l.node.at("inputs").path() : l.spec.path;
      throw common::ConfigError(fmt::format("{}: {} takes two inputs or more, found {}", where,
                                            node_spec.type, node_spec.inputs.size()));
    }
    spec.nodes.push_back(std::move(node_spec));
    NodeSpec& placed = spec.nodes.back();
    placed.out = placed.config->output_dims(spec.input_dims_of(k), placed.path);
    if (k + 1 < order.size() && placed.config->activation() == Activation::kSoftmax)
      l.node.at("activation").fail("softmax is only supported as the output's activation");
  }
  const NodeSpec& last = spec.nodes.back();
  if (!last.out.flat() && !last.out.sequence) {
    throw common::ConfigError(fmt::format(
        "{}: the model must end in a flat output (a dense layer) or a sequence (a dense layer on "
        "each position); it ends in {}x{}x{}",
        last.path, last.out.h, last.out.w, last.out.c));
  }
  return spec;
}

std::string model_json(const common::JsonNode& node, const ModelSpec& spec) {
  if (node.at("input_shape").as_array().size() != 2) return node.dump();  // as given: old
  common::JsonWriter w;  // checkpoints keep matching
  w.begin_object().key("input_shape").begin_array();
  w.value(spec.height).value(spec.width).value(spec.channels).end_array();
  for (const auto& [key, value] : node.as_object()) {
    if (key != "input_shape") w.key(key).raw(value.dump());
  }
  return w.end_object().str();
}

const NodeSpec* ModelSpec::first_gpu_untested() const {
  for (const NodeSpec& node : nodes) {
    const LayerKind* kind = find_layer_kind(node.type);
    if (!(kind && kind->gpu_tested && node.config->gpu_tested())) return &node;
  }
  return nullptr;
}

std::string gpu_untested_reason(const NodeSpec& node) {
  const LayerKind* kind = find_layer_kind(node.type);
  return fmt::format(
      "{}: {}{} has not passed its parity test on a GPU yet, so it does not run on one (train "
      "with \"device\": \"cpu\")",
      node.path, node.type, kind && kind->gpu_tested ? " with these keys" : "");
}

}  // namespace dtrain::nn
