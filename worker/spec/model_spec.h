// The `train.model` object: the model as a graph (docs/design.md#the-model-as-a-graph). One
// input of shape input_shape, named "input"; layers, each naming the layers it takes ("inputs";
// absent: the layer listed before it, or the input for the first); one output (the key
// "output", else the last layer). A chain of layers without names or inputs is Keras's
// Sequential. Parsed, ordered, and checked: every reference resolves, nothing is a cycle or
// unused, and every shape fits (errors name the JSON path). Knows nothing of buffers or backends.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/spec/layer_config.h"
#include "worker/spec/layer_registry.h"

namespace dtrain::nn {

/// One layer of the graph.
struct NodeSpec {
  std::string name;  ///< its "name", else "layers.<i>.<type>"
  std::string type;  ///< "conv2d"
  std::string path;  ///< where it was given, for messages: "model.layers[3]"
  /// Each input: another node's index (always lower: nodes are in topological order), or
  /// kModelInput.
  std::vector<size_t> inputs;
  static constexpr size_t kModelInput = static_cast<size_t>(-1);
  /// Its tensors' names start with this: "<name>." ("layers.0.conv2d." in a chain without names,
  /// as checkpoints have always named them).
  std::string param_prefix;
  std::shared_ptr<const LayerConfig> config;
  Dims out;  ///< one example's output size
};

struct ModelSpec {
  /// input_shape [h, w, c] (channels last, as Keras); a 2-D [h, w] is read as [h, w, 1]; a 1-D
  /// [T] is a sequence of T token ids (height T, width and channels 1, sequence true) when an
  /// embedding layer reads the input, else T features (height and width 1, channels T).
  int height = 0, width = 0, channels = 0;
  bool sequence = false;
  std::vector<NodeSpec> nodes;  ///< in topological order; the output is the last
  Dims input_dims() const { return {channels, height, width, sequence}; }
  Dims output_dims() const { return nodes.back().out; }
  /// The input's shape as the data readers take it (data::load_data): [height, width, channels],
  /// or [T] for a sequence of token ids.
  std::vector<int> data_shape() const {
    if (sequence) return {height};
    return {height, width, channels};
  }
  /// The output's units: a sequence's last axis (its vocabulary), else the whole output.
  int units() const {
    const Dims out = output_dims();
    return out.sequence ? out.w : static_cast<int>(out.size());
  }
  /// Sizes of node i's inputs.
  std::vector<Dims> input_dims_of(size_t i) const;
  /// The first node whose kind, or whose keys, have not passed their parity test on a GPU (the
  /// GPU rule, docs/design.md#the-model-as-a-graph), or null.
  const NodeSpec* first_gpu_untested() const;
  /// The first node whose training forward sums over every worker's batch
  /// (LayerConfig::sums_over_group), or null.
  const NodeSpec* first_group_node() const {
    for (const NodeSpec& node : nodes)
      if (node.config->sums_over_group()) return &node;
    return nullptr;
  }
};

/// Why node may not run on a GPU: "<path>: <type>[ with these keys] has not passed its parity
/// test on a GPU yet, ...", for the model's and the launcher's refusals.
std::string gpu_untested_reason(const NodeSpec& node);

/// Parses train.model. Throws ConfigError "model.layers[2].units: ..." for anything wrong.
ModelSpec parse_model_spec(const common::JsonNode& node);

/// train.model as compact JSON, the architecture checkpoints and model.json record: the text as
/// given, except that a 2-D input_shape is written as the [h, w, 1] it means (so readers of
/// model.json always find three numbers).
std::string model_json(const common::JsonNode& node, const ModelSpec& spec);

}  // namespace dtrain::nn
