// Keras's SGD (momentum, nesterov) and Adam over the model's flat parameter buffer, with their
// slots (velocity; first and second moments) in flat buffers of the same size on the model's
// device, so a checkpoint saves them in one piece each. The arithmetic is the Backend's, applied
// range by range so each gradient bucket is applied as soon as its all-reduce is done.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/json.h"
#include "worker/nn/backend.h"
#include "worker/train/lr_schedule.h"

namespace dtrain::train {

struct OptimizerSpec {
  std::string type = "sgd";
  nn::SgdParams sgd;                   ///< sgd.learning_rate: the schedule's initial rate
  nn::AdamParams adam;                 ///< adam.learning_rate: the schedule's initial rate
  LearningRateSchedule learning_rate;  ///< the rate per step (a constant by default)
};

/// Parses train.optimizer with Keras's defaults. Throws ConfigError naming the JSON path.
OptimizerSpec parse_optimizer_spec(const common::JsonNode& node);

class Optimizer {
 public:
  /// Slots on device, zero-filled. total_steps (the run's epochs x steps per epoch) and workers
  /// resolve the schedule: a decay over the whole run, scale_learning_rate.
  Optimizer(const OptimizerSpec& spec, size_t parameter_count, nn::Device& device,
            int64_t total_steps = 1, int workers = 1);

  /// Starts one update: counts iterations (Keras's `iterations`, Adam's t) and takes the
  /// schedule's rate for the step.
  void begin_step();
  /// Enqueues this step's update of parameters [offset, offset + count) from gradients. The
  /// update is elementwise, so applying ranges one by one equals applying the whole buffer.
  void apply(nn::Backend& backend, nn::Buffer<float>& parameters,
             const nn::Buffer<float>& gradients, size_t offset, size_t count);

  /// True when an update's arguments do not change from step to step (SGD), so a recorded
  /// update may be replayed; Adam's rate depends on the step.
  bool same_every_step() const { return spec_.type != "adam" && spec_.learning_rate.constant(); }
  /// The rate the next step will use (what Keras logs as `learning_rate`).
  double learning_rate() const { return spec_.learning_rate.rate(iterations_); }
  int64_t iterations() const { return iterations_; }
  void set_iterations(int64_t n) { iterations_ = n; }
  /// Named slot buffers ("sgd.velocity"; "adam.m", "adam.v"), for checkpoints.
  std::vector<std::pair<std::string, nn::Buffer<float>*>> slots();

 private:
  OptimizerSpec spec_;
  int64_t iterations_ = 0;
  nn::Buffer<float> first_, second_;
};

}  // namespace dtrain::train
