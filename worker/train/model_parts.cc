// See model_parts.h.
#include "worker/train/model_parts.h"

#include <fmt/format.h>

#include "common/errors.h"
#include "worker/comm/ring_communicator.h"
#include "worker/data/batcher.h"
#include "worker/train/loss.h"
#include "worker/train/train_step.h"

namespace dtrain::train {

ModelParts build_model_parts(const TrainConfig& config, nn::Backend& backend, int classes,
                             comm::Window window) {
  ModelParts parts;
  parts.model = std::make_unique<nn::Model>(config.model, backend, config.per_worker_batch_size,
                                            window.data, window.floats);
  if (parts.model->classes() < classes) {
    throw common::ConfigError(
        fmt::format("model: the last layer has {} units but the data has {} classes",
                    parts.model->classes(), classes));
  }
  parts.model->initialize(config.seed);
  parts.optimizer = std::make_unique<Optimizer>(config.optimizer, parts.model->parameters().size(),
                                                backend.device());
  parts.optimizer->set_parameters(parts.model->parameter_infos());
  parts.stager = std::make_unique<InputStager>(backend.device(), parts.model->input_dims().size(),
                                               config.per_worker_batch_size,
                                               label_words(loss_options(config), *parts.model));
  return parts;
}

ModelParts warm_model_parts(const TrainConfig& config, nn::Backend& backend,
                            const data::Dataset& train) {
  ModelParts parts = build_model_parts(config, backend, train.classes);
  // Epoch 0's first batch of a world of one: real images and labels of the batch size the first
  // step after promotion has (every batch is full), through every input slot.
  data::BatchStreamOptions batches;
  batches.seed = config.seed;
  batches.batch_size = config.per_worker_batch_size;
  data::Batch batch = data::BatchStream(train, batches).batch_at(0);
  int n = static_cast<int>(batch.size);
  for (int slot = 0; slot < InputStager::kSlots; ++slot)
    parts.stager->stage(slot, batch.images.data(), batch.labels.data(), n);
  parts.stager->ready();
  {
    comm::SoloCommunicator solo;
    StepOptions options;
    options.overlap = config.overlap;
    options.graphs = false;  // a graph of this step would never be replayed
    options.slots = InputStager::kSlots;
    TrainStep step(*parts.model, *parts.optimizer, backend, solo, options);
    step.run(parts.stager->images(0), parts.stager->labels(0), n, {config.seed, 0, 0}, 0);
    step.stop_agreed(0);  // waits for the step
  }
  // Everything the step changed, put back as build_model_parts leaves it. (The step's statistics
  // and epoch totals went with its TrainStep; the stager's slots are staged again before use.)
  nn::Device& device = backend.device();
  parts.model->initialize(config.seed);
  device.fill_zero(parts.model->gradients().data(), parts.model->gradients().bytes());
  for (auto& [name, slot] : parts.optimizer->slots()) device.fill_zero(slot->data(), slot->bytes());
  parts.optimizer->set_iterations(0);
  device.synchronize();
  return parts;
}

}  // namespace dtrain::train
