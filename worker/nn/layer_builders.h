// How each kind of layer is built: one table from a type name ("conv2d") to the function in
// worker/nn/layers/<type>.cc that makes its Layer from its parsed keys. The kinds and their keys
// are the spec library's (worker/spec/layer_registry.h); this is the runtime's half of a kind, so
// the spec library never links the backends.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "worker/nn/layer.h"
#include "worker/spec/model_spec.h"

namespace dtrain::nn {

/// The built layer of node (its config parsed by the spec registry's kind of node.type), for
/// inputs of these sizes. EnforceError for a type without a builder: a bug, the spec registry and
/// the builders' table disagree.
std::unique_ptr<Layer> make_layer(const NodeSpec& node, const std::vector<Dims>& in,
                                  const LayerContext& c);

/// True when type has a builder (a test checks every kind of the spec registry has one).
bool has_layer_builder(std::string_view type);

}  // namespace dtrain::nn
