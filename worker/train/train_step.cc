// See train_step.h.
#include "worker/train/train_step.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>

#include "common/clock.h"
#include "common/errors.h"

namespace dtrain::train {

std::vector<GradientBucket> plan_buckets(const std::vector<nn::GradientPiece>& pieces,
                                         size_t min_floats) {
  std::vector<GradientBucket> buckets;
  GradientBucket open;
  for (size_t i = 0; i < pieces.size(); ++i) {
    DT_ENFORCE(open.count == 0 || pieces[i].offset + pieces[i].count == open.offset,
               "gradient piece {} is not just below the one before", i);
    open.offset = pieces[i].offset;  // each piece lies just below the one before
    open.count += pieces[i].count;
    open.last_piece = i;
    bool layer_ends = i + 1 == pieces.size() || pieces[i + 1].layer != pieces[i].layer;
    if (open.count >= min_floats || (layer_ends && open.count >= min_floats / 4)) {
      buckets.push_back(open);
      open = GradientBucket{};
    }
  }
  if (open.count > 0) buckets.push_back(open);
  return buckets;
}

bool whole_steps_possible(nn::Device& device, const comm::Communicator& comm) {
  return device.kind() == nn::DeviceKind::kHost || !comm.stream_ordered();
}

TrainStep::TrainStep(nn::Model& model, Optimizer& optimizer, nn::Backend& backend,
                     comm::Communicator& comm, StepOptions options)
    : model_(model),
      optimizer_(optimizer),
      backend_(backend),
      device_(backend.device()),
      comm_(comm),
      options_(options),
      // Alone, one bucket: the optimizer updates every parameter in one pass.
      buckets_(plan_buckets(model.gradient_pieces(),
                            (options.virtual_size > 0 ? options.virtual_size : comm.size()) > 1
                                ? options.min_bucket_floats
                                : SIZE_MAX)),
      stats_(device_, kStatsFloats),
      totals_(device_, kTotalsFloats),
      stop_flag_(device_, 1),
      readback_(device_, kStatsFloats * static_cast<size_t>(options.slots)),
      own_losses_(device_, static_cast<size_t>(options.slots)),
      loss_scale_(options.loss_scale),
      scale_state_(device_, nn::Backend::kLossScaleFloats),
      rules_(optimizer.spec(), model.parameter_infos(), device_),
      skipped_readback_(device_, static_cast<size_t>(options.slots)) {
  DT_ENFORCE(options_.slots >= 1 && options_.slots <= nn::Device::kMarkers, "{} input slots",
             options_.slots);
  // A graph replays fixed kernel arguments: the step key (dropout) and Adam's step-dependent
  // rate are arguments, so those run launch by launch. The loss scale and its skips live in
  // device memory (docs/design.md#loss-scaling).
  graphable_ = options_.graphs && comm_.stream_ordered() && !model_.has_random_layers() &&
               optimizer_.same_every_step() && device_.kind() == nn::DeviceKind::kCuda;
  count_in_arguments_ = loss_scale_.dynamic() && !optimizer_.same_every_step();
  upload_loss_scale();
  graphs_.resize(static_cast<size_t>(options_.slots));
  graph_inputs_.resize(static_cast<size_t>(options_.slots) * 2, nullptr);
  graph_generations_.resize(static_cast<size_t>(options_.slots), 0);
  graph_batches_.resize(static_cast<size_t>(options_.slots), 0);
  DT_ENFORCE(!options_.whole_steps || whole_steps_possible(device_, comm_),
             "whole steps on a GPU need a communicator staged through the host");
  if (rules_.active() && device_.kind() == nn::DeviceKind::kCuda) {
    throw common::ConfigError(
        "train.optimizer: clipnorm and global_clipnorm have not passed their parity test on a "
        "GPU yet, so they do not run on one (train with \"device\": \"cpu\")");
  }
  // Synchronized batch normalization sums over the group inside forward and backward
  // (docs/design.md#synchronized-batch-normalization): each sum is queued behind the gradient
  // buckets already started, in the same order on every worker.
  if (model_.spec().first_group_node()) {
    model_.set_group_sum(
        [this](float* data, size_t count) { finish(start(data, count, comm::ReduceOp::kSum)); });
  }
}

TrainStep::~TrainStep() {
  model_.set_group_sum({});
}

// A host communicator may reduce inside start (the default implementation waits for its peers
// there): both calls count as waiting.
comm::ReduceTicket TrainStep::start(float* data, size_t count, comm::ReduceOp op) {
  double started = common::monotonic_seconds();
  comm::ReduceTicket ticket = comm_.start_all_reduce(data, count, op);
  times_.wait_seconds += common::monotonic_seconds() - started;
  return ticket;
}

void TrainStep::finish(comm::ReduceTicket ticket) {
  double started = common::monotonic_seconds();
  comm_.finish_all_reduce(ticket);
  double waited = common::monotonic_seconds() - started;
  exposed_seconds_ += waited;
  times_.wait_seconds += waited;
}

void TrainStep::enqueue(const float* images, const int32_t* labels, int n, const nn::StepKey& key,
                        int slot) {
  device_.fill_zero(stats_.data(), stats_.bytes());
  nn::StepKey shard_key = key;
  shard_key.shard = comm_.rank();  // a whole group: each member holds its own shard
  const float* logits = model_.forward(images, n, shard_key, true);
  apply_loss(backend_, options_.loss, model_, n, logits, labels, model_.logits_gradient(),
             stats_.data());
  device_.download_async(own_losses_.data() + slot, stats_.data(), sizeof(float));  // before sums
  scale_loss_gradient(n);
  device_.upload(stats_.data() + offsetof(StepStats, stop) / sizeof(float), stop_flag_.data(),
                 sizeof(float));
  std::vector<comm::ReduceTicket> tickets;
  auto start_bucket = [&](size_t b) {
    tickets.push_back(start(model_.gradients().data() + buckets_[b].offset, buckets_[b].count,
                            comm::ReduceOp::kMean));
  };
  // Alone, nothing waits for a bucket: the layers produce their gradients whole (a large
  // kernel's in one product instead of pieces).
  std::function<void(size_t)> piece_done;
  if (grouped()) {
    piece_done = [&](size_t piece) {
      if (options_.overlap && tickets.size() < buckets_.size() &&
          buckets_[tickets.size()].last_piece == piece) {
        start_bucket(tickets.size());
      }
    };
  }
  model_.backward(n, piece_done);
  while (tickets.size() < buckets_.size()) start_bucket(tickets.size());
  comm::ReduceTicket stats_ticket = start(stats_.data(), kStatsFloats, comm::ReduceOp::kSum);
  // The layers' batch statistics (BatchNormalization's), summed over the shards in rank order.
  nn::Buffer<float>& statistics = model_.statistics();
  comm::ReduceTicket statistics_ticket;
  if (statistics.size() > 0)
    statistics_ticket = start(statistics.data(), statistics.size(), comm::ReduceOp::kSum);
  // Nothing changes until no collective of the step can fail (whole steps), or until every
  // gradient is in and, with a dynamic loss scale, known finite.
  if (options_.whole_steps || loss_scale_.enabled() || rules_.active()) {
    for (size_t b = 0; b < buckets_.size(); ++b) finish(tickets[b]);
    finish(stats_ticket);
    if (statistics.size() > 0) finish(statistics_ticket);
    apply_all(slot);
  } else {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      finish(tickets[b]);
      optimizer_.apply(backend_, model_.parameters(), model_.gradients(), buckets_[b].offset,
                       buckets_[b].count);
      applied_ = b + 1;
    }
    finish(stats_ticket);
    if (statistics.size() > 0) finish(statistics_ticket);
  }
  if (statistics.size() > 0) model_.update_state(shard_count());
  backend_.add(kTotalsFloats, stats_.data(), totals_.data());
}

void TrainStep::test_slow_step() {
  if (options_.test_slow_step_seconds <= 0) return;
  if (!options_.test_slow_step_on_cpu) {
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.test_slow_step_seconds));
    return;
  }
  auto cpu_seconds = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  const double until = cpu_seconds() + options_.test_slow_step_seconds;
  while (cpu_seconds() < until) {
  }
}

// On the host everything has run when run_step returns: its wall time is the step's, and all
// of it that was not spent in the all-reduce calls is compute.
void TrainStep::run(const float* images, const int32_t* labels, int n, const nn::StepKey& key,
                    int slot) {
  double started = common::monotonic_seconds(), waited_before = times_.wait_seconds;
  test_slow_step();
  run_step(images, labels, n, key, slot);
  double elapsed = common::monotonic_seconds() - started;
  times_.compute_seconds += elapsed - (times_.wait_seconds - waited_before);
  ++times_.steps;
}

std::optional<StepTimes> TrainStep::take_step_times() {
  if (device_.kind() != nn::DeviceKind::kHost) return std::nullopt;
  if (times_.steps > 0) {
    last_taken_ = times_;
    times_ = StepTimes{};
  }
  return last_taken_;
}

bool TrainStep::abandon_step() {
  bool cut_short = in_step_;
  if (in_step_) {
    DT_ENFORCE(applied_ == 0, "a step cut short after it applied {} bucket(s)", applied_);
    optimizer_.set_iterations(iterations_before_);
  }
  settle_loss_scale();  // the steps before the one cut short may hold skips the host counted
  in_step_ = false;
  applied_ = 0;
  steps_run_ = 0;
  return cut_short;
}

void TrainStep::run_step(const float* images, const int32_t* labels, int n, const nn::StepKey& key,
                         int slot) {
  DT_ENFORCE(slot >= 0 && slot < options_.slots, "input slot {}", slot);
  learn_skips();
  iterations_before_ = optimizer_.iterations();
  applied_ = 0;
  in_step_ = true;
  optimizer_.begin_step();
  if (graphable_ && steps_run_ > 0) {    // the first step ran launch by launch: plans and memory
    auto s = static_cast<size_t>(slot);  // exist, so nothing allocates while recording
    // Record again when the inputs moved or the backend replaced scratch memory the graph
    // points into (an evaluation with other shapes may have grown a workspace).
    if (!graphs_[s] || graph_inputs_[2 * s] != images ||
        graph_inputs_[2 * s + 1] != static_cast<const void*>(labels) ||
        graph_generations_[s] != backend_.scratch_generation() || graph_batches_[s] != n) {
      graphs_[s].reset();
      device_.begin_capture();
      try {
        enqueue(images, labels, n, key, slot);
        device_.download_async(readback_.data() + kStatsFloats * s, stats_.data(), stats_.bytes());
      } catch (...) {
        try {
          device_.end_capture();
        } catch (...) {
        }
        throw;
      }
      graphs_[s] = device_.end_capture();
      graph_generations_[s] = backend_.scratch_generation();
      graph_batches_[s] = n;
      graph_inputs_[2 * s] = images;
      graph_inputs_[2 * s + 1] = reinterpret_cast<const float*>(labels);
    }
    graphs_[s]->launch();
    graphed_ = true;
  } else {
    enqueue(images, labels, n, key, slot);
    device_.download_async(readback_.data() + kStatsFloats * static_cast<size_t>(slot),
                           stats_.data(), stats_.bytes());
  }
  device_.record_marker(slot);
  in_step_ = false;
  last_slots_[1] = last_slots_[0];
  last_slots_[0] = slot;
  ++steps_run_;
}

int TrainStep::shard_count() const {
  return options_.virtual_size > 0 ? options_.virtual_size : comm_.size();
}

bool TrainStep::grouped() const {
  return shard_count() > 1;
}

void TrainStep::run_shards(const comm::ShardPlan& shards, const ShardInput* inputs,
                           const nn::StepKey& key, int slot) {
  DT_ENFORCE(device_.kind() == nn::DeviceKind::kHost, "virtual shards on a {} device",
             device_.name());
  DT_ENFORCE(shards.held >= 1 && slot >= 0 && slot < options_.slots, "{} shards, slot {}",
             shards.held, slot);
  const nn::NodeSpec* grouped = model_.spec().first_group_node();
  DT_ENFORCE(!grouped, "{}: synchronized batch normalization in a partial elastic group",
             grouped ? grouped->path : "");
  double started = common::monotonic_seconds(), waited_before = times_.wait_seconds;
  test_slow_step();  // a member holding several shards is still the slow one
  learn_skips();
  iterations_before_ = optimizer_.iterations();
  applied_ = 0;
  in_step_ = true;
  optimizer_.begin_step();
  enqueue_shards(shards, inputs, key, slot);
  device_.download_async(readback_.data() + kStatsFloats * static_cast<size_t>(slot), stats_.data(),
                         stats_.bytes());
  device_.record_marker(slot);
  in_step_ = false;
  last_slots_[1] = last_slots_[0];
  last_slots_[0] = slot;
  ++steps_run_;
  double elapsed = common::monotonic_seconds() - started;
  times_.compute_seconds += elapsed - (times_.wait_seconds - waited_before);
  ++times_.steps;
}

// Each shard's forward, loss and backward as its own worker would run them (the same batch
// size, the same step key, backward reporting its pieces), then the sums in virtual-shard order.
void TrainStep::enqueue_shards(const comm::ShardPlan& shards, const ShardInput* inputs,
                               const nn::StepKey& key, int slot) {
  const auto held = static_cast<size_t>(shards.held);
  const size_t floats = model_.gradients().size();
  shard_gradients_.resize(held - 1);
  shard_stats_.assign(held * kStatsFloats, 0.0f);
  const std::function<void(size_t)> piece_done = [](size_t) {};
  nn::Buffer<float>& statistics = model_.statistics();
  shard_statistics_.assign(held * statistics.size(), 0.0f);
  for (size_t j = 0; j < held; ++j) {
    device_.fill_zero(stats_.data(), stats_.bytes());
    nn::StepKey shard_key = key;
    shard_key.shard = shards.shard(static_cast<int>(j));
    const float* logits = model_.forward(inputs[j].images, inputs[j].n, shard_key, true);
    apply_loss(backend_, options_.loss, model_, inputs[j].n, logits, inputs[j].labels,
               model_.logits_gradient(), stats_.data());
    scale_loss_gradient(inputs[j].n);
    model_.backward(inputs[j].n, piece_done);
    std::memcpy(shard_stats_.data() + j * kStatsFloats, stats_.data(), stats_.bytes());
    std::copy(statistics.data(), statistics.data() + statistics.size(),
              shard_statistics_.begin() + static_cast<long>(j * statistics.size()));
    if (j + 1 < held) {
      shard_gradients_[j].resize(floats);
      std::memcpy(shard_gradients_[j].data(), model_.gradients().data(), floats * sizeof(float));
    }
  }
  // The stop request rides in the first shard's statistics, as each worker's rides in its own.
  shard_stats_[offsetof(StepStats, stop) / sizeof(float)] = *stop_flag_.data();
  float own = 0;  // the shards' losses before the sum, host memory
  for (size_t j = 0; j < held; ++j) own += shard_stats_[j * kStatsFloats];
  own_losses_.data()[slot] = own;
  std::vector<float*> pieces(held);
  auto reduce = [&](float* const* buffers, size_t count, comm::ReduceOp op) {
    double asked = common::monotonic_seconds();
    comm_.all_reduce_shards(shards.virtual_size, shards.first, buffers, shards.held, count, op);
    double waited = common::monotonic_seconds() - asked;
    exposed_seconds_ += waited;
    times_.wait_seconds += waited;
  };
  for (const GradientBucket& bucket : buckets_) {
    for (size_t j = 0; j < held; ++j) {
      float* base = j + 1 < held ? shard_gradients_[j].data() : model_.gradients().data();
      pieces[j] = base + bucket.offset;
    }
    reduce(pieces.data(), bucket.count, comm::ReduceOp::kMean);
  }
  for (size_t j = 0; j < held; ++j) pieces[j] = shard_stats_.data() + j * kStatsFloats;
  reduce(pieces.data(), kStatsFloats, comm::ReduceOp::kSum);
  std::memcpy(stats_.data(), shard_stats_.data(), stats_.bytes());
  if (statistics.size() > 0) {
    for (size_t j = 0; j < held; ++j) pieces[j] = shard_statistics_.data() + j * statistics.size();
    reduce(pieces.data(), statistics.size(), comm::ReduceOp::kSum);
    std::copy(shard_statistics_.begin(),
              shard_statistics_.begin() + static_cast<long>(statistics.size()), statistics.data());
  }
  apply_all(slot);  // nothing changed until every sum was in
  if (statistics.size() > 0) model_.update_state(shard_count());
  backend_.add(kTotalsFloats, stats_.data(), totals_.data());
}

// Keras's LossScaleOptimizer scales the loss before its gradient; here the gradient of the mean
// loss is scaled instead, the same numbers (by a power of two, exactly).
void TrainStep::scale_loss_gradient(int n) {
  if (!loss_scale_.enabled()) return;
  backend_.scale(static_cast<size_t>(rows(n)) * static_cast<size_t>(model_.classes()),
                 scale_state_.data() + nn::Backend::kLossScale, model_.logits_gradient());
}

// Keras: a skipped step leaves the weights, the slots and the inner optimizer's iterations (Adam's
// t, the schedule's step) as they were; only the loss scale changes. Every worker holds the same
// reduced gradients, so every worker skips the same steps without asking the others. The device
// decides (docs/design.md#loss-scaling): the update's kernels read the step's flag, and, where
// the update depends on the count, the flag of the step before, whose outcome the host may not
// know yet.
void TrainStep::apply_all(int slot) {
  const float *skip = nullptr, *previous = nullptr;
  float* state = scale_state_.data();
  if (loss_scale_.enabled()) {
    unscale_gradients();
    if (loss_scale_.dynamic()) {
      skip = state + nn::Backend::kNonfinite;
      if (count_in_arguments_ && unsettled_ > 0) previous = state + nn::Backend::kPreviousSkipped;
    }
  }
  // Regularizers and clipping on the reduced, unscaled gradient: once, the same on every worker.
  rules_.apply(backend_, model_.parameters().data(), model_.gradients().data(), stats_.data());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    optimizer_.apply(backend_, model_.parameters(), model_.gradients(), buckets_[b].offset,
                     buckets_[b].count, skip, previous);
    applied_ = b + 1;
  }
  if (loss_scale_.dynamic()) {
    backend_.update_loss_scale(state, loss_scale_.spec().growth_steps);
    if (count_in_arguments_) {  // learn_skips reads it
      device_.download_async(skipped_readback_.data() + slot, state + nn::Backend::kSkipped,
                             sizeof(float));
    }
    ++unsettled_;
  }
}

// The flag is 0 here: update_loss_scale clears it after each step, upload_loss_scale writes 0.
void TrainStep::unscale_gradients() {
  float* state = scale_state_.data();
  float* flag = loss_scale_.dynamic() ? state + nn::Backend::kNonfinite : nullptr;
  for (const GradientBucket& b : buckets_) {
    backend_.unscale_gradients(b.count, state + nn::Backend::kLossScale,
                               model_.gradients().data() + b.offset, flag);
  }
}

// An update whose arguments depend on the optimizer's count may be enqueued while one earlier
// step's outcome is unknown (its kernels read that step's flag), not two: so before such a step
// the host learns the outcome of the step before last from its read-back. The trainer has
// already waited for that step (stop_agreed(1)), so this adds no sync there.
void TrainStep::learn_skips() {
  if (!count_in_arguments_ || unsettled_ < 2) return;
  DT_ENFORCE(steps_run_ >= 2, "{} steps of unknown outcome after {} steps", unsettled_, steps_run_);
  int slot = last_slots_[1];
  device_.wait_marker(slot, options_.timeout_seconds);
  count_skips(static_cast<int64_t>(skipped_readback_.data()[slot]));
  // The last step's outcome stays unknown, unless it used the same slot (then that is what was
  // read).
  unsettled_ = last_slots_[0] == slot ? 0 : 1;
}

void TrainStep::count_skips(int64_t skipped) {
  if (skipped > skipped_settled_) {  // the host counted those steps as applied
    optimizer_.set_iterations(optimizer_.iterations() - (skipped - skipped_settled_));
    skipped_settled_ = skipped;
  }
}

void TrainStep::settle_loss_scale() {
  if (!loss_scale_.enabled()) return;
  std::vector<float> state = scale_state_.to_host();
  count_skips(static_cast<int64_t>(state[nn::Backend::kSkipped]));
  unsettled_ = 0;
  loss_scale_.set_state(
      {state[nn::Backend::kLossScale], static_cast<int64_t>(state[nn::Backend::kGoodSteps])});
}

const LossScale& TrainStep::loss_scale() {
  settle_loss_scale();
  return loss_scale_;
}

int64_t TrainStep::skipped_steps() {
  settle_loss_scale();
  return skipped_settled_;
}

void TrainStep::set_loss_scale_state(const LossScaleState& state) {
  settle_loss_scale();
  loss_scale_.set_state(state);
  upload_loss_scale();
}

void TrainStep::upload_loss_scale() {
  scale_state_.from_host({loss_scale_.scale(), static_cast<float>(loss_scale_.good_steps()), 0.0f,
                          static_cast<float>(skipped_settled_), 0.0f});
  unsettled_ = 0;
}

bool TrainStep::stop_agreed(int steps_ago) {
  DT_ENFORCE(steps_ago >= 0 && steps_ago <= 1, "stop flag of {} steps ago", steps_ago);
  if (steps_run_ <= steps_ago) return false;
  int slot = last_slots_[static_cast<size_t>(steps_ago)];
  device_.wait_marker(slot, options_.timeout_seconds);
  StepStats stats{};
  std::memcpy(&stats, readback_.data() + kStatsFloats * static_cast<size_t>(slot), sizeof stats);
  return stats.stop > 0.0f;
}

TrainStep::StepLosses TrainStep::step_losses(int steps_ago) const {
  DT_ENFORCE(steps_ago >= 0 && steps_ago <= 1, "losses of {} steps ago", steps_ago);
  if (steps_run_ <= steps_ago) return {};
  auto slot = static_cast<size_t>(last_slots_[static_cast<size_t>(steps_ago)]);
  return {readback_.data()[kStatsFloats * slot], own_losses_.data()[slot]};
}

EpochTotals TrainStep::totals() {
  std::vector<float> host = totals_.to_host();
  return {host[0], host[1], host[2]};
}

void TrainStep::set_totals(const EpochTotals& t) {
  totals_.from_host(
      {static_cast<float>(t.loss_sum), static_cast<float>(t.correct), static_cast<float>(t.seen)});
}

}  // namespace dtrain::train
