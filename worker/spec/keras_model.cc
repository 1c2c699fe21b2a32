// See keras_model.h. Keras's side, read from keras-team/keras: serialization_lib.py (each object
// as {"module", "class_name", "config", "registered_name"}, plus "build_config" and
// "compile_config"), sequential.py (config.layers, an InputLayer first; build_input_shape),
// functional.py (config.layers, each with "name" and "inbound_nodes"; input_layers and
// output_layers as [layer_name, node_index, tensor_index]) and saving_lib.py (the .keras zip).
// The translation is parsed by nn::parse_model_spec, whose messages are put back in Keras's terms.
#include "worker/spec/keras_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "common/file_bytes.h"
#include "common/json.h"
#include "common/zip_reader.h"
#include "worker/spec/keras_layer.h"
#include "worker/spec/keras_layout.h"

namespace dtrain::train {
namespace {

using common::JsonNode;

constexpr const char* kInputName = "input";  // dtrain's name for the model's input

// One entry of the model's config.layers.
struct Entry {
  JsonNode node;                        ///< the entry: {"module", "class_name", "config", ...}
  JsonNode config;                      ///< its "config"
  std::string name;                     ///< Keras's name; "" for a Sequential layer without one
  std::string label;                    ///< `layer "conv2d_1" (Conv2D)`, for messages
  const nn::LayerKind* kind = nullptr;  ///< null for the InputLayer
};

// The message of an error about a JSON path inside entry_path, with that path made relative to
// the layer's config or, outside it, to the layer: "config.layers[2].config.groups: ..." is
// "groups: ...", "config.layers[2].inbound_nodes: ..." "inbound_nodes: ...".
std::string inside(const std::string& message, const std::string& entry_path) {
  for (const std::string& prefix : {entry_path + ".config.", entry_path + ".", entry_path + ": "}) {
    if (message.compare(0, prefix.size(), prefix) == 0) return message.substr(prefix.size());
  }
  return message;
}

// Runs fn; a ConfigError from it names the layer: "<label>: <path inside the layer>: ...".
template <typename Fn>
void within(const Entry& entry, Fn&& fn) {
  try {
    fn();
  } catch (const common::ConfigError& error) {
    throw common::ConfigError(entry.label + ": " + inside(error.what(), entry.node.path()));
  }
}

// The entry checked as far as it is the same in both kinds of model. Its label comes first,
// from what can be read, so that every later mistake names the layer.
Entry read_entry(const JsonNode& node, size_t index, bool functional) {
  Entry e{node, node, "", "", nullptr};
  std::string class_name;
  if (node.is_object()) {
    if (auto c = node.find("class_name"); c && c->is_string()) class_name = c->as_string();
    std::optional<JsonNode> name = node.find("name");
    if (!functional) {
      std::optional<JsonNode> config = node.find("config");
      name = config && config->is_object() ? config->find("name") : std::nullopt;
    }
    if (name && name->is_string()) e.name = name->as_string();
  }
  e.label = e.name.empty() ? fmt::format("layer {}", index) : fmt::format("layer \"{}\"", e.name);
  if (!class_name.empty()) e.label += fmt::format(" ({})", class_name);
  within(e, [&] {
    if (functional) {
      node.check_keys({"module", "class_name", "config", "registered_name", "build_config", "name",
                       "inbound_nodes"});
    } else {
      node.check_keys({"module", "class_name", "config", "registered_name", "build_config"});
    }
    keras::check_keras_class(node);
    e.config = node.at("config");
    if (functional) node.at("name").as_nonempty_string();
    if (auto n = e.config.find("name"); n && n->as_nonempty_string() != e.name)
      n->fail(fmt::format("\"{}\" differs from the layer's name \"{}\"", n->as_string(), e.name));
    if (auto b = node.find("build_config"); b && !b->is_null())
      b->as_object();  // not read: dtrain infers every shape from the input's
    if (class_name == "InputLayer") return;
    e.kind = nn::find_keras_class(class_name);
    if (!e.kind) {
      node.fail(fmt::format("the class {} is not supported (dtrain reads InputLayer, {})",
                            class_name, nn::keras_class_list()));
    }
    if (const std::string package = keras::keras_package(node);
        !package.empty() && package != e.kind->keras_package) {
      node.at(node.find("module") ? "module" : "registered_name")
          .fail(fmt::format("{}'s {} is not a class dtrain reads (it reads {}'s)", package,
                            class_name, e.kind->keras_package));
    }
  });
  return e;
}

std::vector<Entry> read_entries(const JsonNode& config, bool functional) {
  std::vector<Entry> entries;
  std::vector<JsonNode> layers = config.at("layers").as_array();
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < layers.size(); ++i) {
    entries.push_back(read_entry(layers[i], i, functional));
    const Entry& e = entries.back();
    if (e.name.empty()) continue;
    auto [it, fresh] = by_name.emplace(e.name, i);
    if (!fresh) {
      within(e, [&] {
        throw common::ConfigError(fmt::format("the name is taken by layer {}", it->second));
      });
    }
  }
  return entries;
}

// A Sequential's or Functional's own keys besides its layers.
void check_model_keys(const JsonNode& config) {
  if (auto n = config.find("name")) n->as_string();
  if (auto n = config.find("trainable"); n && !n->as_bool())
    n->fail("false is not supported (dtrain trains every layer)");
  if (auto n = config.find("dtype")) keras::check_dtype(*n);
}

// The model as a graph of entries, before it is written as dtrain's.
struct Graph {
  std::vector<int> input_shape;                  ///< [h, w, c], or [T] (token ids)
  std::string input_where;                       ///< where it was given, for messages
  std::vector<const Entry*> layers;              ///< in the file's order, the input left out
  std::vector<std::vector<std::string>> inputs;  ///< by layer: empty in a chain
  /// by layer: arguments of its call passed to its kind's parse (name, JSON); empty in a chain
  std::vector<std::vector<std::pair<std::string, std::string>>> call_keys;
  std::string output;  ///< "" in a chain (the last layer)
};

Graph read_sequential(const JsonNode& config, const std::vector<Entry>& entries) {
  config.check_keys({"name", "trainable", "dtype", "layers", "build_input_shape"});
  check_model_keys(config);
  Graph g;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.kind) {
      g.layers.push_back(&e);
      g.inputs.emplace_back();
      g.call_keys.emplace_back();
    } else if (i > 0) {
      within(e, [&] { e.node.fail("an InputLayer may only come first"); });
    } else {
      within(e, [&] { g.input_shape = keras::input_layer_shape(e.config); });
      g.input_where = e.label + ": batch_shape";
    }
  }
  if (auto n = config.find("build_input_shape"); n && !n->is_null()) {
    std::vector<int> built = keras::batch_shape(*n);
    if (g.input_shape.empty()) {
      g.input_shape = built;
      g.input_where = n->path();
    } else if (built != g.input_shape) {
      n->fail("differs from the InputLayer's batch_shape");
    }
  }
  if (g.input_shape.empty()) {
    config.fail(
        "the model has no input shape (no InputLayer, no build_input_shape): start it "
        "with keras.Input(shape=...) before saving");
  }
  if (g.layers.empty()) config.at("layers").fail("the model has no layers besides its input");
  return g;
}

// The layer of a [layer_name, node_index, tensor_index] triple (a KerasTensor's keras_history).
std::string history_layer(const JsonNode& triple) {
  std::vector<JsonNode> items = triple.as_array();
  if (items.size() != 3) triple.fail("expected [layer_name, node_index, tensor_index]");
  std::string name = items[0].as_nonempty_string();
  if (items[1].as_int(0, INT32_MAX) != 0)
    items[1].fail("a layer's second call is not supported (dtrain calls each layer once)");
  if (items[2].as_int(0, INT32_MAX) != 0)
    items[2].fail("a layer's second output is not supported (dtrain's layers have one)");
  return name;
}

// input_layers or output_layers: one triple, or the list or dict of them the model was built
// with. Nesting is bounded by the JSON parser's depth limit.
void collect_triples(const JsonNode& node, std::vector<JsonNode>& out) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.as_object()) collect_triples(value, out);
    return;
  }
  std::vector<JsonNode> items = node.as_array();
  if (items.size() == 3 && items[0].is_string()) {
    out.push_back(node);
    return;
  }
  for (const JsonNode& item : items) collect_triples(item, out);
}

// The one layer input_layers or output_layers names: dtrain models have one input and one output.
std::string the_one(const JsonNode& node, const char* what) {
  std::vector<JsonNode> triples;
  collect_triples(node, triples);
  if (triples.size() != 1) {
    node.fail(fmt::format("dtrain models have one {}; this one has {}", what, triples.size()));
  }
  return history_layer(triples[0]);
}

// A serialized KerasTensor ({"class_name": "__keras_tensor__", "config": {"shape", "dtype",
// "keras_history"}}): the layer whose output it is. Its shape is not read (dtrain infers it).
// *ids is set when its dtype is an integer one (token ids: only the model's input may be).
std::string tensor_layer(const JsonNode& tensor, bool* ids) {
  tensor.check_keys({"class_name", "config"});
  JsonNode class_name = tensor.at("class_name");
  if (class_name.as_string() != "__keras_tensor__")
    class_name.fail(fmt::format("expected \"__keras_tensor__\" (a layer's output), found {}",
                                class_name.describe()));
  JsonNode config = tensor.at("config");
  config.check_keys({"shape", "dtype", "keras_history"});
  *ids = false;
  if (auto dtype = config.find("dtype")) {
    *ids = keras::is_token_dtype(*dtype);
    if (!*ids) keras::check_dtype(*dtype);
  }
  return history_layer(config.at("keras_history"));
}

// What a Functional's layer is called on (its one inbound node) and with what.
struct Call {
  std::vector<JsonNode> inputs;  ///< the tensors of its first argument
  /// Arguments that must be the first input's tensor (KerasArg::kSameTensor), with their names.
  std::vector<std::pair<JsonNode, std::string>> same_tensors;
  /// Arguments passed to the kind's parse (KerasArg::kFlag): name and JSON value.
  std::vector<std::pair<std::string, std::string>> keys;
};

// One argument of the call after its inputs, as spec says it is taken. A positional one's path
// ends in args[i], so its message names the argument; a keyword's path does.
void take_argument(const JsonNode& value, const nn::KerasArgSpec& spec, bool positional,
                   Call& call) {
  const std::string named = positional ? fmt::format("{}: ", spec.name) : "";
  const std::string shown = value.is_object() || value.is_array() ? value.describe() : value.dump();
  switch (spec.how) {
    case nn::KerasArg::kSameTensor:
      if (!value.is_null()) call.same_tensors.emplace_back(value, spec.name);
      return;
    case nn::KerasArg::kNull:
      if (!value.is_null())
        value.fail(fmt::format("{}{} is not supported (dtrain supports only null)", named, shown));
      return;
    case nn::KerasArg::kFalse:
      if (value.dump() != "false")
        value.fail(fmt::format("{}{} is not supported (dtrain supports only false)", named, shown));
      return;
    case nn::KerasArg::kFlag:
      if (value.dump() != "true" && value.dump() != "false")
        value.fail(fmt::format("{}{} is not supported (true or false)", named, shown));
      call.keys.emplace_back(spec.name, value.dump());
      return;
  }
}

// The arguments after the inputs of a kind that lists them (nn::LayerKind::keras_call).
void read_arguments(const std::vector<JsonNode>& args, const std::optional<JsonNode>& kwargs,
                    const nn::LayerKind& kind, Call& call) {
  const std::vector<nn::KerasArgSpec> specs = kind.keras_call();
  for (size_t i = 1; i < args.size(); ++i) {
    if (i > specs.size()) {
      args[i].fail(
          fmt::format("{}'s call takes at most {} arguments", kind.keras_class, specs.size() + 1));
    }
    take_argument(args[i], specs[i - 1], true, call);
  }
  if (!kwargs) return;
  for (const auto& [key, value] : kwargs->as_object()) {
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&](const nn::KerasArgSpec& a) { return key == a.name; });
    if (it == specs.end()) {
      std::string known;
      for (const nn::KerasArgSpec& a : specs)
        known += fmt::format("{}{}", known.empty() ? "" : ", ", a.name);
      value.fail(fmt::format("not an argument of {}'s call that dtrain knows (it knows: {})",
                             kind.keras_class, known));
    }
    if (std::distance(specs.begin(), it) + 1 < static_cast<std::ptrdiff_t>(args.size()))
      value.fail("given also as a positional argument");
    take_argument(value, *it, false, call);
  }
}

Call read_call(const Entry& e) {
  JsonNode nodes_node = e.node.at("inbound_nodes");
  std::vector<JsonNode> nodes = nodes_node.as_array();
  if (nodes.empty()) nodes_node.fail("the layer is never called (dtrain's layers are called once)");
  if (nodes.size() > 1) {
    nodes_node.fail(
        fmt::format("the layer is called {} times (shared weights), which is not "
                    "supported (dtrain's layers are called once)",
                    nodes.size()));
  }
  const JsonNode& node = nodes[0];
  if (node.is_array()) node.fail("this is Keras 2's form of a call; dtrain reads Keras 3's files");
  node.check_keys({"args", "kwargs"});
  JsonNode args_node = node.at("args");
  std::vector<JsonNode> args = args_node.as_array();
  std::optional<JsonNode> kwargs = node.find("kwargs");
  Call call;
  if (e.kind->keras_call) {
    if (args.empty()) args_node.fail("expected the layer's inputs as its first argument");
    read_arguments(args, kwargs, *e.kind, call);
  } else {
    if (kwargs) {
      for (const auto& [key, value] : kwargs->as_object()) {
        if ((key == "mask" || key == "training") && value.is_null()) continue;
        value.fail(
            fmt::format("{} is not supported (dtrain passes only the inputs)", value.dump()));
      }
    }
    if (args.size() != 1) {
      args_node.fail(fmt::format("expected one argument (a tensor, or a list of tensors), found {}",
                                 args.size()));
    }
  }
  call.inputs = args[0].is_array() ? args[0].as_array() : std::vector<JsonNode>{args[0]};
  return call;
}

Graph read_functional(const JsonNode& config, const std::vector<Entry>& entries) {
  config.check_keys({"name", "trainable", "dtype", "layers", "input_layers", "output_layers"});
  check_model_keys(config);
  std::string input = the_one(config.at("input_layers"), "input");
  std::string output = the_one(config.at("output_layers"), "output");
  std::map<std::string, const Entry*> by_name;
  size_t input_layers = 0;
  for (const Entry& e : entries) {
    by_name[e.name] = &e;
    input_layers += e.kind ? 0 : 1;
  }
  if (input_layers > 1) {
    config.at("layers").fail(
        fmt::format("dtrain models have one input; this one has {} InputLayers", input_layers));
  }
  Graph g;
  auto it = by_name.find(input);
  if (it == by_name.end() || it->second->kind)
    config.at("input_layers").fail(fmt::format("\"{}\" is not an InputLayer of the model", input));
  it = by_name.find(output);
  if (it == by_name.end())
    config.at("output_layers").fail(fmt::format("\"{}\" is no layer of the model", output));
  if (!it->second->kind)
    config.at("output_layers").fail(fmt::format("\"{}\" is the model's input", output));
  g.output = output;
  for (const Entry& e : entries) {
    within(e, [&] {
      if (!e.kind) {
        if (!e.node.at("inbound_nodes").as_array().empty())
          e.node.at("inbound_nodes").fail("an InputLayer is not called on anything");
        g.input_shape = keras::input_layer_shape(e.config);
        g.input_where = e.label + ": batch_shape";
        return;
      }
      const Call call = read_call(e);
      std::vector<std::string> names, keras_names;
      for (const JsonNode& tensor : call.inputs) {
        bool ids = false;
        std::string name = tensor_layer(tensor, &ids);
        auto from = by_name.find(name);
        if (from == by_name.end())
          tensor.fail(
              fmt::format("keras_history names \"{}\", which is no layer of the model", name));
        if (ids && from->second->kind)
          tensor.at("config").at("dtype").fail(
              "an integer tensor is not supported here (only the model's input holds token ids)");
        names.push_back(from->second->kind ? name : kInputName);
        keras_names.push_back(name);
      }
      for (const auto& [tensor, argument] : call.same_tensors) {
        bool ids = false;
        const std::string name = tensor_layer(tensor, &ids);
        if (keras_names.size() != 1 || name != keras_names[0]) {
          tensor.fail(fmt::format(
              "{}: the output of \"{}\" is not supported (dtrain's {} is self-attention: its "
              "{} is the tensor it is called on, \"{}\")",
              argument, name, e.kind->keras_class, argument,
              keras_names.empty() ? "" : keras_names[0]));
        }
      }
      g.layers.push_back(&e);
      g.inputs.push_back(std::move(names));
      g.call_keys.push_back(call.keys);
    });
  }
  return g;
}

// The translation: train.model as dtrain reads it.
std::string write_graph(const Graph& g) {
  common::JsonWriter w;
  w.begin_object().key("input_shape").begin_array();
  for (int size : g.input_shape) w.value(size);
  w.end_array().key("layers").begin_array();
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const Entry& e = *g.layers[i];
    within(e, [&] {
      w.begin_object();
      if (!e.name.empty()) w.key("name").value(e.name);
      w.key("type").value(e.kind->type);
      if (!g.inputs[i].empty()) {
        w.key("inputs").begin_array();
        for (const std::string& input : g.inputs[i]) w.value(input);
        w.end_array();
      }
      keras::write_layer_keys(e.config, *e.kind, w);
      for (const auto& [key, json] : g.call_keys[i]) w.key(key).raw(json);
      w.end_object();
    });
  }
  w.end_array();
  if (!g.output.empty()) w.key("output").value(g.output);
  return w.end_object().str();
}

// nn::parse_model_spec's message about the translation, in the file's terms: "layers[3].inputs:
// ..." is `layer "add" (Add): inbound_nodes: ...`, "layers[3] (\"add\"): ..." the same without
// the key, input_shape the InputLayer's batch_shape, output the model's output_layers.
std::string relabel(const std::string& message, const Graph& g) {
  const std::string layers = "layers[";
  if (message.rfind(layers, 0) == 0) {
    size_t i = 0;
    const char* digits = message.data() + layers.size();
    auto [end, ec] = std::from_chars(digits, message.data() + message.size(), i);
    if (ec == std::errc() && *end == ']' && i < g.layers.size()) {
      std::string rest(end + 1);
      if (rest.rfind(" (\"", 0) == 0 && rest.find("\"): ") != std::string::npos)
        rest = rest.substr(rest.find("\"): ") + 2);
      if (rest.rfind(": ", 0) == 0) rest = rest.substr(2);
      if (rest.rfind('.', 0) == 0) rest = rest.substr(1);
      if (rest.rfind("inputs", 0) == 0) rest = "inbound_nodes" + rest.substr(6);
      return g.layers[i]->label + ": " + rest;
    }
  }
  if (message.rfind("input_shape", 0) == 0) return g.input_where + message.substr(11);
  if (message.rfind("output", 0) == 0) return "config.output_layers" + message.substr(6);
  return message;
}

// The model's envelope as read, but for compile_config: model.keras holds an uncompiled model.
std::string envelope_without_compile_config(const JsonNode& root) {
  common::JsonWriter w;
  w.begin_object();
  for (const auto& [key, value] : root.as_object()) {
    if (key != "compile_config") w.key(key).raw(value.dump());
  }
  return w.end_object().str();
}

KerasModel translate(const JsonNode& root) {
  if (!root.is_object())
    root.fail(fmt::format("expected a Keras model, found {}", root.describe()));
  if (auto version = root.find("keras_version")) {
    version->fail(
        fmt::format("{}: this is Keras 2's format; dtrain reads Keras 3's "
                    "(model.to_json(), or the .keras archive)",
                    version->describe()));
  }
  root.check_keys(
      {"module", "class_name", "config", "registered_name", "build_config", "compile_config"});
  const std::string class_name = keras::check_keras_class(root);
  // Not read: build_config (shapes dtrain infers), compile_config (train's loss and optimizer
  // say how dtrain trains).
  for (const char* key : {"build_config", "compile_config"}) {
    if (auto n = root.find(key); n && !n->is_null()) n->as_object();
  }
  const bool functional = class_name == "Functional";
  if (!functional && class_name != "Sequential") {
    root.at("class_name")
        .fail(fmt::format("{} is not a model dtrain reads (Sequential or Functional)", class_name));
  }
  JsonNode config = root.at("config");
  std::vector<Entry> entries = read_entries(config, functional);
  Graph g = functional ? read_functional(config, entries) : read_sequential(config, entries);
  KerasModel model;
  model.model_json = write_graph(g);
  common::JsonDocument doc = common::JsonDocument::parse(model.model_json, "the translation");
  try {
    model.spec = nn::parse_model_spec(doc.root());
  } catch (const common::ConfigError& error) {
    throw common::ConfigError(relabel(error.what(), g));
  }
  check_keras_layout(model.spec);  // before training, not at its end, when model.keras is written
  model.keras_config = envelope_without_compile_config(root);
  return model;
}

}  // namespace

KerasModel translate_keras_model(std::string_view json, const std::string& source) {
  try {
    common::JsonDocument doc = common::JsonDocument::parse(json, source);
    return translate(doc.root());
  } catch (const common::ConfigError& error) {
    std::string message = error.what();
    if (message.rfind(source + ": ", 0) == 0) throw;
    throw common::ConfigError(fmt::format("{}: {}", source, message));
  }
}

KerasModel read_keras_model(const std::string& path) {
  auto bytes = std::make_shared<const common::FileBytes>(path);
  const char* text = reinterpret_cast<const char*>(bytes->data());
  const std::string_view head(text, std::min<uint64_t>(bytes->size(), 4));
  if (head != "PK\x03\x04" && head != "PK\x05\x06")  // not a zip's local or end record
    return translate_keras_model(std::string_view(text, bytes->size()), path);
  common::ZipReader archive(std::move(bytes));  // read once
  if (!archive.find("config.json")) {
    throw common::ConfigError(
        fmt::format("{}: a zip archive without config.json is not a Keras model (.keras)", path));
  }
  return translate_keras_model(archive.read_bytes("config.json"), path + ": config.json");
}

}  // namespace dtrain::train
