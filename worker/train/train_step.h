// One synchronous data-parallel training step, enqueued on the model's device without a host
// sync: forward, loss (labels on the device), backward with each gradient bucket's all-reduce
// started as soon as backward has produced it (reverse layer order), a small all-reduce of the
// step's loss, correct count, examples and stop flag, the optimizer bucket by bucket as each
// all-reduce finishes, epoch totals accumulated on the device, and an asynchronous read-back
// of the reduced stop flag that the trainer reads one step later. On CUDA with a stream-ordered
// communicator the whole step is captured once per input slot as a CUDA graph and replayed.
// With loss scaling (mixed_float16, docs/design.md#loss-scaling) the loss gradient is scaled and
// the reduced gradients unscaled and checked before the optimizer sees any of them; then
// regularizers and gradient clipping (gradient_rules.h).
// It does not fetch batches, print, or checkpoint: the trainer does.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/membership.h"
#include "worker/nn/model.h"
#include "worker/train/gradient_rules.h"
#include "worker/train/loss.h"
#include "worker/train/loss_scale.h"
#include "worker/train/optimizer.h"

namespace dtrain::train {

/// A contiguous range of the flat gradient buffer reduced in one all-reduce.
struct GradientBucket {
  size_t offset = 0;
  size_t count = 0;
  size_t last_piece = 0;  ///< complete once backward has enqueued this gradient piece
};

/// Consecutive gradient pieces (in the order backward produces them) joined into buckets of at
/// least min_floats, except that a bucket also ends where a layer ends once it holds a quarter
/// of that (so a large layer's last piece does not wait for the next layer's gradients). A pure
/// function of the model's layout, so every worker and every run uses the same buckets, with
/// overlap or without.
std::vector<GradientBucket> plan_buckets(const std::vector<nn::GradientPiece>& pieces,
                                         size_t min_floats);

/// One step's statistics as the stats all-reduce sums them: four floats on the device, in this
/// order (the loss writes the first three, backend.h's softmax_cross_entropy totals).
/// Trivial (no initializers) so it can be copied from the device's floats.
struct StepStats {
  float loss_sum;  ///< of the step's examples, over all workers once reduced
  float correct;
  float seen;  ///< examples
  float stop;  ///< > 0 when any worker asked to stop
};
static_assert(sizeof(StepStats) == 4 * sizeof(float), "StepStats is reduced as 4 floats");

/// The epoch's totals over all workers so far (kept on the device as 3 floats).
struct EpochTotals {
  double loss_sum = 0, correct = 0, seen = 0;
  double mean_loss() const { return loss_sum / (seen > 1 ? seen : 1); }
  double accuracy() const { return correct / (seen > 1 ? seen : 1); }
};

/// A worker's own step time, split in two, summed over steps: what tells the straggler of a
/// synchronous group (it computes longest and waits least) from its peers, which all run at its
/// pace (docs/design.md#renderers).
struct StepTimes {
  double compute_seconds = 0;  ///< in run(), outside the all-reduce calls
  double wait_seconds = 0;     ///< in start/finish_all_reduce: the peers' lateness and the transfer
  int64_t steps = 0;
};

struct StepOptions {
  bool overlap = true;                 ///< start buckets during backward (false: after it)
  bool graphs = true;                  ///< capture the step as a device graph where possible
  size_t min_bucket_floats = 1 << 18;  ///< 1 MiB
  int slots = 2;                       ///< input slots (one graph each)
  double timeout_seconds = 300;        ///< longest wait for a step's read-back
  /// Test only (DTRAIN_TEST_SLOW_STEP_MS): host seconds slept in each step's compute part, to
  /// make this worker the group's straggler; or, with test_slow_step_on_cpu, seconds of this
  /// thread's CPU time spent spinning (a step that needs the CPU, which a quota can starve).
  double test_slow_step_seconds = 0;
  bool test_slow_step_on_cpu = false;
  /// Whole steps (in-place recovery, docs/design.md#in-place-recovery): the optimizer applies
  /// the buckets only once every all-reduce of the step has finished, so a step whose collective
  /// fails has changed nothing but the optimizer's count, which abandon_step() puts back. Costs
  /// the overlap of one bucket's update with later buckets' all-reduces. Only where
  /// whole_steps_possible.
  bool whole_steps = false;
  /// Elastic jobs (docs/design.md#elastic-membership): the cluster's ring size, the number of
  /// virtual shards of the global batch, whatever the group's size now; it fixes the buckets
  /// and the way backward produces the gradients. 0: the communicator's size.
  int virtual_size = 0;
  /// Keras's LossScaleOptimizer (docs/design.md#loss-scaling): the trainer turns it on under
  /// mixed_float16 or train.loss_scale; tests force it in any math mode. When on, the optimizer
  /// applies a step only once every bucket's all-reduce has finished (as whole_steps do).
  LossScaleSpec loss_scale = {};
  /// train.loss: its kind, from_logits and label_smoothing.
  LossOptions loss = {};
};

/// One virtual shard's batch, already on the device.
struct ShardInput {
  const float* images = nullptr;
  const int32_t* labels = nullptr;
  int n = 0;
};

/// Whether StepOptions::whole_steps can hold on device with comm: on the host, or on a GPU whose
/// communicator blocks until each all-reduce is done (staged through the host), so a failed one
/// throws before anything later is enqueued. Not over NCCL, whose failures surface after the
/// optimizer's kernels are already queued.
bool whole_steps_possible(nn::Device& device, const comm::Communicator& comm);

/// Not copyable; single-threaded. model, optimizer, backend and comm must outlive it.
class TrainStep {
 public:
  TrainStep(nn::Model& model, Optimizer& optimizer, nn::Backend& backend, comm::Communicator& comm,
            StepOptions options);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  /// Enqueues one step on a batch already on the device (images, labels of n examples; they
  /// must stay unchanged until the step has run). slot (< options.slots) names the input slot
  /// for graph reuse. On the host everything has run when this returns.
  void run(const float* images, const int32_t* labels, int n, const nn::StepKey& key, int slot);
  /// The step of a member of a partial elastic group (docs/design.md#elastic-membership), which
  /// holds shards.held virtual shards (inputs: one per shard, in the plan's order): forward,
  /// loss and backward of each shard in turn, each into its own gradients, then each bucket's
  /// sharded all-reduce (Communicator::all_reduce_shards), the statistics' too, and the
  /// optimizer. Host devices only; always whole steps. The result is bit for bit what the full
  /// group's step gives.
  void run_shards(const comm::ShardPlan& shards, const ShardInput* inputs, const nn::StepKey& key,
                  int slot);
  /// Waits for step `steps_ago` ago's read-back and says whether any worker had asked to stop
  /// by then (the same answer on every worker). 0: the last step run (a sync), 1: the one before.
  bool stop_agreed(int steps_ago);
  /// The losses of step `steps_ago` ago (0 or 1, as stop_agreed, which has waited for it):
  /// the group's sum, the same on every worker, and this worker's own part before the sum.
  struct StepLosses {
    double group = 0, own = 0;
  };
  StepLosses step_losses(int steps_ago) const;
  /// This worker's stop request: carried by every later step's stats all-reduce.
  void request_stop() { *stop_flag_.data() = 1.0f; }
  /// After a collective of run() failed (options.whole_steps): puts back the optimizer's
  /// iteration count, so the model and optimizer hold the whole state from before that step, and
  /// forgets the steps run (stop_agreed answers false until the next one). Returns true when a
  /// step was cut short. EnforceError when one was cut short after it changed the parameters
  /// (without options.whole_steps).
  bool abandon_step();

  /// The epoch's totals so far over all workers (a sync).
  EpochTotals totals();
  /// Sets the epoch totals (0 at an epoch start; a checkpoint's on resume).
  void set_totals(const EpochTotals& totals);
  /// Host seconds spent waiting for all-reduces (the exposed communication), since last reset.
  double exposed_comm_seconds() const { return exposed_seconds_; }
  void reset_exposed_comm_seconds() { exposed_seconds_ = 0; }
  /// The step times summed since the last call, and resets them; when no step has run since,
  /// what the last call returned (a report right after another one repeats it rather than
  /// dropping the fields; steps == 0 before any step). nullopt on a device other than
  /// the host: there run() only enqueues, and timing the device's work would need events read
  /// back each step, which this does not do (no host sync is added to the step).
  std::optional<StepTimes> take_step_times();
  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  /// Brings the host's copy of the loss scale up to date from the device (a sync on a GPU): the
  /// state, the steps skipped, and the optimizer's iterations, which the host counted as if
  /// every step applied (the device decides skips: docs/design.md#loss-scaling). Between steps
  /// only; the trainer settles before it reads the optimizer's count for a checkpoint, a report
  /// or a broadcast. Nothing to do without a loss scale.
  void settle_loss_scale();
  /// The loss scale and its state, settled first.
  const LossScale& loss_scale();
  /// A checkpoint's (or the group's) state, between steps.
  void set_loss_scale_state(const LossScaleState& state);
  /// Steps skipped for a non-finite gradient since this TrainStep was made, settled first.
  int64_t skipped_steps();
  /// True once a step runs as a replayed graph.
  bool graphed() const { return graphed_; }

 private:
  /// Sleeps (or spins) options_.test_slow_step_seconds (test only), whichever way the step runs.
  void test_slow_step();
  void run_step(const float* images, const int32_t* labels, int n, const nn::StepKey& key,
                int slot);
  void enqueue(const float* images, const int32_t* labels, int n, const nn::StepKey& key, int slot);
  void enqueue_shards(const comm::ShardPlan& shards, const ShardInput* inputs,
                      const nn::StepKey& key, int slot);
  /// Whether the layers report each gradient piece (a group): with virtual shards, always when
  /// there are several, so a partial group computes exactly what the full one does.
  bool grouped() const;
  /// The virtual shards of the global batch (the group's size unless elastic).
  int shard_count() const;
  /// Multiplies the loss gradient of n examples by the loss scale, when there is one.
  void scale_loss_gradient(int n);
  /// The loss's rows for n examples: one per example, or per position of a sequence output (a
  /// language model's tokens), so the loss and its figures are per token.
  int rows(int n) const { return n * model_.positions(); }
  /// After every all-reduce of the step: the optimizer's update of every bucket, or, with loss
  /// scaling, the gradients unscaled first and, for a dynamic scale, the update gated by the
  /// device's flags (docs/design.md#loss-scaling) and the scale's rule applied.
  void apply_all(int slot);
  /// Unscales every bucket's gradients by the scale in device memory, raising its flag where one
  /// is not finite (a dynamic scale).
  void unscale_gradients();
  /// Before a step whose update depends on the optimizer's count: the outcome of every step but
  /// the last, from the read-back of the step before last (its marker, which the trainer has
  /// usually waited for already).
  void learn_skips();
  /// Takes the skips among `skipped` (steps skipped so far) that the host does not know yet off
  /// the optimizer's count.
  void count_skips(int64_t skipped);
  /// Writes the host's copy of the loss scale's state to the device (the flag cleared).
  void upload_loss_scale();
  comm::ReduceTicket start(float* data, size_t count, comm::ReduceOp op);
  void finish(comm::ReduceTicket ticket);

  nn::Model& model_;
  Optimizer& optimizer_;
  nn::Backend& backend_;
  nn::Device& device_;
  comm::Communicator& comm_;
  StepOptions options_;
  std::vector<GradientBucket> buckets_;
  /// run_shards: the gradients and statistics of each held shard but the last (whose are the
  /// model's), on the host.
  std::vector<std::vector<float>> shard_gradients_;
  std::vector<float> shard_stats_;
  std::vector<float> shard_statistics_;  ///< run_shards: each held shard's layer statistics
  static constexpr size_t kStatsFloats = sizeof(StepStats) / sizeof(float);
  static constexpr size_t kTotalsFloats = 3;  ///< StepStats's loss_sum, correct, seen

  nn::Buffer<float> stats_;             ///< this step's StepStats
  nn::Buffer<float> totals_;            ///< the epoch's reduced loss sum, correct, examples
  nn::PinnedBuffer<float> stop_flag_;   ///< this worker's request, read by the upload each step
  nn::PinnedBuffer<float> readback_;    ///< reduced StepStats of each input slot's last step
  nn::PinnedBuffer<float> own_losses_;  ///< this worker's loss sum of each slot's last step
  int64_t steps_run_ = 0;
  std::array<int, 2> last_slots_{0, 0};  ///< input slots of the last two steps
  bool graphable_ = false, graphed_ = false;
  std::vector<std::unique_ptr<nn::DeviceGraph>> graphs_;  ///< per slot
  std::vector<const float*> graph_inputs_;                ///< the images each graph reads
  std::vector<uint64_t> graph_generations_;  ///< the backend's scratch generation at recording
  std::vector<int> graph_batches_;           ///< the batch size each graph was recorded for
  double exposed_seconds_ = 0;
  StepTimes times_;       ///< since take_step_times(); wait_seconds grows inside start and finish
  StepTimes last_taken_;  ///< what take_step_times() returned last with steps > 0
  // The step in flight, for abandon_step.
  bool in_step_ = false;
  size_t applied_ = 0;             ///< buckets applied so far
  int64_t iterations_before_ = 0;  ///< the optimizer's count before begin_step
  LossScale loss_scale_;  ///< the spec, and the host's copy of the state (settle_loss_scale)
  /// The state in device memory, Backend::kLossScaleFloats: scale, finite steps in a row, this
  /// step's flag, steps skipped, the step before's flag.
  nn::Buffer<float> scale_state_;
  /// Regularizers and gradient clipping (docs/design.md#regularizers-and-clipping): when active,
  /// every step applies whole, after all its all-reduces.
  GradientRules rules_;
  /// A dynamic scale under an update whose arguments depend on the optimizer's count (Adam's
  /// t, a schedule's rate): the gate's second flag and learn_skips are needed.
  bool count_in_arguments_ = false;
  /// Per input slot: the steps skipped so far, read back after that slot's last step (when
  /// count_in_arguments_).
  nn::PinnedBuffer<float> skipped_readback_;
  int64_t skipped_settled_ = 0;  ///< skipped steps the optimizer's count already excludes
  /// Steps whose update was enqueued but whose outcome the host has not read: it counted them
  /// as applied.
  int64_t unsettled_ = 0;
};

}  // namespace dtrain::train
