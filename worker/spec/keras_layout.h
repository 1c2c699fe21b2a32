// How a model's weights map onto Keras's layout (docs/train-config.md#keras-model-files): Keras
// lays feature maps out channels-last, dtrain channels-first, so after a Flatten the order of
// features differs, and every weight that sees them (a Dense's kernel rows) must be written in
// Keras's order. This file works out each layer's input order from the model's graph, and
// refuses a model for which dtrain cannot write one; worker/train/keras_archive.h writes the
// weights with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/spec/model_spec.h"

namespace dtrain::train {

/// Keras's order of a flat output's features where it differs from dtrain's: feature k in Keras
/// is dtrain's feature (*order)[k]. Null where they agree (feature maps, whose layouts differ
/// but which no weight sees in flat order, and whatever a Dense or a pooling made flat).
using FeatureOrder = std::shared_ptr<const std::vector<uint32_t>>;

/// Each node's input order (of its first input: what its weights see), in spec.nodes' order.
/// Throws as check_keras_layout.
std::vector<FeatureOrder> keras_input_orders(const nn::ModelSpec& spec);

/// Throws ConfigError `layer "<name>" (<Class>): ...` when the model's weights have no Keras
/// layout dtrain can write: a layer after a Flatten of a feature map that would need Keras's
/// channels-last order of its features and is neither elementwise nor a Dense, or a kind
/// whose feature order dtrain does not know. Called when the job's model is read, so that such
/// a model fails before training rather than at its end.
void check_keras_layout(const nn::ModelSpec& spec);

/// Keras's class of a node's kind ("Conv2D", "Dense", ...).
std::string keras_class(const nn::NodeSpec& node);

}  // namespace dtrain::train
