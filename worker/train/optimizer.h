// Keras's SGD (momentum, nesterov), Adam, AdamW and RMSprop (momentum, centered) over the model's
// flat parameter buffer, with their slots (velocity; moments; mean square, momentum and mean
// gradient) in flat buffers of the same size on the model's device, so a checkpoint saves them in
// one piece each. The arithmetic is the Backend's, applied range by range so each gradient bucket
// is applied as soon as its all-reduce is done. Keras 3's weight_decay on every optimizer (with
// exclude_from_weight_decay by tensor name); clipnorm and global_clipnorm are parsed with the
// spec (worker/spec/optimizer_spec.h) and applied by the step (gradient_rules.h), which sees the
// whole reduced gradient.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "worker/nn/backend.h"
#include "worker/nn/layer.h"
#include "worker/spec/optimizer_spec.h"

namespace dtrain::train {

class Optimizer {
 public:
  /// Slots on device, zero-filled. total_steps (the run's epochs x steps per epoch) and workers
  /// resolve the schedule: a decay over the whole run, scale_learning_rate.
  Optimizer(const OptimizerSpec& spec, size_t parameter_count, nn::Device& device,
            int64_t total_steps = 1, int workers = 1);

  /// Resolves the schedule again, from the spec as parsed, for another run length or group size
  /// (a spare builds its optimizer before it knows its group: docs/design.md#spares).
  void resolve_schedule(int64_t total_steps, int workers);

  /// Starts one update: counts iterations (Keras's `iterations`, Adam's t) and takes the
  /// schedule's rate for the step.
  void begin_step();
  /// Enqueues this step's update of parameters [offset, offset + count) from gradients. The
  /// update is elementwise, so applying ranges one by one equals applying the whole buffer.
  /// A dynamic loss scale's flags, in device memory or null (docs/design.md#loss-scaling):
  /// skip raised, the update changes nothing; previous_skipped raised, the step before was
  /// skipped without the host knowing yet, so the count is one lower than iterations() says and
  /// the update uses that count's rate (and Adam's t).
  void apply(nn::Backend& backend, nn::Buffer<float>& parameters,
             const nn::Buffer<float>& gradients, size_t offset, size_t count,
             const float* skip = nullptr, const float* previous_skipped = nullptr);

  /// True when an update's arguments do not change from step to step (SGD and RMSprop at a
  /// constant rate), so a recorded update may be replayed; Adam's rate depends on the step.
  bool same_every_step() const;
  /// ReduceLROnPlateau's: the constant rate from now on (the schedule must be a constant).
  void set_constant_rate(double rate);
  /// The rate may be set between steps (set_constant_rate): a recorded update must not be
  /// replayed with the old one, so same_every_step() answers false.
  void allow_rate_changes() { rate_may_change_ = true; }
  /// The rate the next step will use (what Keras logs as `learning_rate`).
  double learning_rate() const { return spec_.learning_rate.rate(iterations_); }
  int64_t iterations() const { return iterations_; }
  const OptimizerSpec& spec() const { return spec_; }
  void set_iterations(int64_t n) { iterations_ = n; }
  /// The model's parameter tensors, so weight decay can leave out the excluded ones. Without a
  /// call every parameter is decayed.
  void set_parameters(const std::vector<nn::ParamInfo>& tensors);
  /// Named slot buffers ("sgd.velocity"; "adam.m", "adam.v"; "adamw.m", "adamw.v";
  /// "rmsprop.velocity", "rmsprop.momentum", "rmsprop.average_gradient"), for checkpoints.
  std::vector<std::pair<std::string, nn::Buffer<float>*>> slots();

 private:
  void set_rate(float rate);

  OptimizerSpec spec_;             ///< its learning_rate resolved
  LearningRateSchedule schedule_;  ///< as parsed
  int64_t iterations_ = 0;
  bool rate_may_change_ = false;
  nn::Buffer<float> first_, second_, third_;
  /// The parameter ranges weight decay leaves out (excluded tensors), in offset order.
  std::vector<nn::ParamRange> excluded_;
  /// Decays [offset, offset + count) but its excluded parts (sgd, adam, rmsprop).
  void decay(nn::Backend& backend, float* parameters, size_t offset, size_t count,
             const nn::SkipGate& gate);
  /// Calls f(begin, end, decayed) for the pieces of [offset, offset + count) in order.
  template <class F>
  void for_each_piece(size_t offset, size_t count, F f) const;
};

}  // namespace dtrain::train
