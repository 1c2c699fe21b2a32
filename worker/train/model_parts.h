// What a Trainer trains with that does not depend on its group: the model, the optimizer with its
// slots, and the input slots, built from the train config. A spare (docs/design.md#spares) builds
// them while it waits and warms them with one training step on a real batch, so that after its
// promotion the backend's primitives exist and every buffer has been touched; then it puts back
// everything the step changed. Knows no rank and no group: the Trainer adopts the parts.
#pragma once

#include <memory>

#include "worker/comm/communicator.h"
#include "worker/data/dataset.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/input_stager.h"
#include "worker/train/optimizer.h"

namespace dtrain::train {

/// Owned parts; the backend they were built on must outlive them.
struct ModelParts {
  std::unique_ptr<nn::Model> model;  ///< initialised from train.seed
  /// Slots zero; its schedule resolved for one step and one worker until the Trainer resolves
  /// it for its run (Optimizer::resolve_schedule).
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<InputStager> stager;

  explicit operator bool() const { return model != nullptr; }
};

/// Builds the parts, the gradients in window when they fit it (empty: memory of the model's
/// own). Throws ConfigError when the model does not fit the data (shapes, classes).
ModelParts build_model_parts(const TrainConfig& config, nn::Backend& backend, int classes,
                             comm::Window window = {});

/// A spare's parts, warm: built as above (gradients of their own), then one training step,
/// forward, loss, backward, a world-of-one all-reduce and the optimizer's update, on the first
/// batch of train (through every input slot), and then the weights initialised again, the
/// optimizer's slots and count and the gradients zeroed: the parts are those build_model_parts
/// returns, except that the backend's primitives and every buffer exist. Blocks for the step
/// (tens of ms for the main job's model on a CPU).
ModelParts warm_model_parts(const TrainConfig& config, nn::Backend& backend,
                            const data::Dataset& train);

}  // namespace dtrain::train
