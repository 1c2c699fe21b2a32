// The fit loop: epochs of steps (batch -> staged upload -> TrainStep: forward, loss, backward
// with bucketed all-reduces, optimizer, all on the device without a host sync), validation,
// Keras-style progress, heartbeats, and from the chief metrics.jsonl, TensorBoard summaries,
// BackupAndRestore checkpoints and the final model. The preemption flag is read one step late (the
// same reduced value on every worker, so all stop at the same step); metrics are read back only to
// be shown. On start the chief restores the newest good checkpoint and broadcasts it, so no shared
// file system is needed. Sees a Backend and a Communicator, nothing else of the machine.
// Single-threaded (the batcher prefetches, a host communicator reduces, on their own threads).
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/control_protocol.h"
#include "common/progress_record.h"
#include "worker/comm/communicator.h"
#include "worker/comm/group_communicator.h"
#include "worker/comm/membership.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/callbacks.h"
#include "worker/train/checkpoint.h"
#include "worker/train/evaluator.h"
#include "worker/train/input_stager.h"
#include "worker/train/model_parts.h"
#include "worker/train/model_tensors.h"
#include "worker/train/optimizer.h"
#include "worker/train/progress.h"
#include "worker/train/recovery_client.h"
#include "worker/train/tensorboard.h"
#include "worker/train/timeline.h"
#include "worker/train/train_step.h"

namespace dtrain::train {

struct EpochMetrics {
  int epoch = 0;  ///< 1-based, as printed
  /// accuracy is the loss's companion metric, logged under `companion` (TrainConfig::companion);
  /// val_metrics are train.metrics on the validation data, by name without "val_".
  double loss = 0, accuracy = 0;
  double val_loss = 0, val_accuracy = 0;
  std::string companion = "accuracy";
  std::vector<std::pair<std::string, double>> val_metrics;
  bool validated = false;
  /// By name, as logged: loss, the companion, and when validated val_loss, val_<companion> and
  /// each val_<metric>.
  std::vector<std::pair<std::string, double>> named() const;
  double val_seconds = 0;  ///< the validation's own time (not part of seconds)
  double seconds = 0, samples_per_second = 0;
  /// A language model's samples_per_second x its sequence length; 0 for images (not written).
  double tokens_per_second = 0;
  int64_t steps = 0;  ///< steps this run trained in the epoch (fewer after a mid-epoch resume)
  double allreduce_seconds = 0;  ///< of seconds, the host waited for all-reduces (exposed)
  /// Of seconds, the host waited for the input pipeline's next batch after the epoch's first
  /// (which waits for the pipeline to start): 0 while the pipeline keeps up.
  double input_wait_seconds = 0;
  /// Of seconds, the host spent inside the training step's calls (on a GPU, enqueueing them):
  /// the rest of seconds is the work between steps (docs/design.md#run-directory).
  double step_seconds = 0;
  bool stop_agreed = false;  ///< the group agreed to stop at this epoch's end
  /// The learning rate at the epoch's end, before a callback changed it; -1: not known (an epoch
  /// recorded from a checkpoint's copy), TensorBoard then logs the optimizer's.
  double learning_rate = -1;
};

struct TrainerOptions {
  std::string run_dir;  ///< metrics.jsonl, backup/ and model/ go here (chief only)
  bool chief = true;
  std::string task = "worker:0";  ///< for heartbeats
  int attempt = 0;
  /// Polled once per step; true when this worker was asked to stop (SIGTERM).
  std::function<bool()> stop_requested;
  /// Start-up phases: the trainer marks "model", "checkpoint read", "broadcast" and "first
  /// step", then logs the summary. Optional.
  Timeline* timeline = nullptr;
  /// When stdout is not a terminal: seconds between progress lines inside an epoch (<= 0: one
  /// line per epoch).
  double progress_line_seconds = ProgressBar::kLineSeconds;
  /// This worker's progress record (docs/design.md#frozen-workers): each finished step and its
  /// wall time go there. May be null.
  common::ProgressRecordWriter* record = nullptr;
  /// The worker's recovery client (docs/design.md#the-workers-recovery-client): the group's
  /// generation (sent with heartbeats), an elastic member's shards, and in place the re-formation
  /// of a broken group, which shares the whole state the trainer hands it. Null: generation 0,
  /// not elastic, and a broken group ends fit() with the error. Must outlive the trainer.
  Recovery* recovery = nullptr;
  /// The ledger (train.ledger): each step's example ids of each shard this worker computes go
  /// to this file, one JSON line per shard and step, as the step starts. Empty: none.
  std::string ledger_path = {};
  /// Polled after each step; true when this worker alone is preempted (in place): fit() throws
  /// LeftGroup then, having written no checkpoint; its peers re-form with a replacement.
  std::function<bool()> leave_requested = nullptr;
};

/// Thrown by fit() after every worker agreed to stop at the same step and the chief saved a
/// step checkpoint there: the worker should exit 143.
class Preempted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by fit() after a step when this worker alone was preempted (leave_requested): it
/// leaves the group without a checkpoint, and should end as its SIGTERM would have ended it.
class LeftGroup : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by fit() on every worker at the same point when the group's loss, or the model's
/// weights, became NaN or infinite (Keras's TerminateOnNaN): no checkpoint is written, and the
/// worker should exit kExitNonFinite, which the launcher does not restart (the same data would
/// give the same NaN). docs/design.md#non-finite-losses.
class NonFinite : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Trainer {
 public:
  /// None of the references are owned; all must outlive the trainer. control may be null.
  /// parts: a promoted spare's warm model, optimizer and input slots (model_parts.h), built on
  /// backend from config; empty: the trainer builds its own.
  Trainer(const TrainConfig& config, nn::Backend& backend, comm::Communicator& comm,
          data::Dataset train, data::Dataset test, TrainerOptions options,
          common::ControlClient* control, ModelParts parts = {});
  ~Trainer();

  /// Trains the epochs left after the restored checkpoint; the chief then writes the final model
  /// (and removes the backup folder if asked). Returns the last epoch's metrics. Throws
  /// Preempted (see above), IoError from the communicator or the batcher.
  EpochMetrics fit();
  /// Where training resumed (epoch 0, step 0 for a fresh start).
  const TrainingState& resumed_from() const { return start_; }
  /// Mean loss and accuracy of the model on the test split (no dropout).
  Scores evaluate();

  nn::Model& model() { return *model_; }
  TrainStep& step() { return *step_; }

 private:
  /// fit()'s epochs from state_ on; a broken group escapes as comm::GroupBroken.
  EpochMetrics fit_from_state();
  EpochMetrics train_epoch(int epoch);
  /// Re-forms the group after it broke (options_.recovery) and takes the newest whole state;
  /// rethrows when there is no recovery in place.
  void regroup(const comm::GroupBroken& broken);
  /// What this member offers share_whole_state (whole_state.h): the whole state it holds
  /// (holding: state_ and the model's named set), or none; when no member holds one, the
  /// chief's newest checkpoint, else the initial state. docs/design.md#in-place-recovery, step 4.
  HeldState held_state(bool holding);
  /// Takes the position share_whole_state shared (the named set is already the model's).
  void take_state(const Position& shared);
  /// The whole state this member holds, as it sends it (the named set downloaded).
  Position position();
  /// A fresh group's stored state (the chief's; nullopt elsewhere and when there is none), read
  /// into the named set's host copies.
  std::optional<Position> stored_position();
  /// The chief's newest good checkpoint, read into views (and its epoch_metrics into
  /// epoch_metrics): what a fresh group resumes from. nullopt when there is none.
  std::optional<TrainingState> load_checkpoint(std::vector<TensorView>& views,
                                               std::string& epoch_metrics);
  /// No checkpoint in the backup folder: the final state a finished run left in model/state
  /// (docs/design.md#continuing-a-finished-run), read into views, when it is this model's. A
  /// state short of train.epochs continues (Keras's initial_epoch). One at or past train.epochs
  /// is taken only by a restart within a launch (attempt or generation above 0): at it, nothing
  /// is left to train; past it, a ConfigError. nullopt when there is none, or not taken.
  std::optional<TrainingState> load_final_state(std::vector<TensorView>& views,
                                                std::string& epoch_metrics);
  /// The callbacks' judgement of the epoch just ended (every worker alike) on the model's
  /// weights (views): ModelCheckpoint's best model (the chief writes it), ReduceLROnPlateau's
  /// rate, then EarlyStopping's verdict; true: stop after this epoch.
  bool judge_epoch(const EpochMetrics& m, const std::vector<TensorView>& weights);
  /// At the end of training: EarlyStopping's restore_best_weights, into the model.
  void finish_early_stopping();
  /// The chief, at the end of training: the whole state (weights, optimizer slots, moving
  /// statistics, counters) into model/state, so a later launch with more epochs continues.
  void save_final_state(const std::string& model_dir);
  /// A restart of this launch that found no checkpoint: the chief's final model, when this
  /// launch wrote it (its training ended; the checkpoints went with delete_on_success), read
  /// into views' weights, and the finished state. nullopt otherwise.
  std::optional<TrainingState> load_finished_model(std::vector<TensorView>& views);
  void report_restored();
  /// The chief logs the loss scale after an epoch (docs/design.md#loss-scaling).
  void report_loss_scale();
  /// Brings state_'s optimizer count and loss scale up to date, as checkpoints record them.
  void settle_state();
  /// Saves where training stands; at an epoch's end, with that epoch's metrics (finished), so a
  /// kill before they reach metrics.jsonl does not lose them (see recover_epoch_metrics).
  void save_checkpoint(const EpochMetrics* finished = nullptr);
  /// The chief, resuming from an epoch checkpoint: writes that epoch's metrics.jsonl line and
  /// TensorBoard points from the checkpoint when metrics.jsonl has no line for the epoch.
  void recover_epoch_metrics();
  /// TerminateOnNaN on step `steps_ago` ago's losses (TrainStep::step_losses): every worker
  /// reads the same group sum, so all throw NonFinite at the same step, naming the workers whose
  /// own loss was not finite (an all-gather among them). global_step: that step's.
  void check_finite_loss(int steps_ago, int64_t global_step);
  /// Every worker holds the same weights, so all find the same: throws NonFinite naming the
  /// first tensor with a NaN or an infinity, before `before` (a checkpoint, the final model).
  /// Returns the weights' views (valid until the next download).
  std::vector<TensorView> finite_weights(const char* before);
  /// The communicator's window, where the gradients live on a host device (none on a GPU).
  comm::Window gradient_window();
  /// Host copies of the model's tensors (downloaded now), as named views (ModelTensors).
  std::vector<TensorView> checkpoint_tensors();
  /// Uploads the host copies (as checkpoint_tensors() laid them out) to the device.
  void upload_tensors();
  void show_progress(int epoch, int64_t step, double started, double seen_here, bool force);
  void write_metrics(const EpochMetrics& m);
  /// The chief's TensorBoard summaries of an epoch, as Keras's callback writes them.
  void write_summaries(const EpochMetrics& m);
  /// batch_loss and batch_accuracy (the epoch's running means) now: reads the totals (a sync).
  void write_batch_summary();
  /// Whether this worker has the chief's duties now.
  bool chief() const;
  /// The group's generation now (options_.recovery's; 0 without one).
  int generation() const;
  /// Elastic jobs: the cluster's ring size V, the virtual shards of the global batch; 0 when not
  /// elastic.
  int elastic_size() const;
  /// V: the virtual shards of the global batch (the group's size unless elastic).
  int virtual_size() const;
  /// The shards this member holds now.
  comm::ShardPlan shards() const;
  /// One ledger line per shard: the ids of step's examples.
  void write_ledger(int epoch, int64_t step, const std::vector<const data::BatchStream*>& streams);
  void heartbeat(int epoch, int64_t step, int64_t steps, double loss, double accuracy, double rate);

  const TrainConfig& config_;
  nn::Backend& backend_;
  comm::Communicator& comm_;
  data::Dataset train_, test_;
  TrainerOptions options_;
  common::ControlClient* control_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<TrainStep> step_;
  std::unique_ptr<InputStager> stager_;
  std::unique_ptr<TensorBoardLog> tensorboard_;    ///< the chief's, when train.tensorboard is on
  std::unique_ptr<EarlyStopping> early_stopping_;  ///< train.callbacks', or none
  std::unique_ptr<ModelCheckpoint> model_checkpoint_;  ///< train.callbacks', or none
  std::unique_ptr<ReduceLrOnPlateau> reduce_lr_;       ///< train.callbacks', or none
  std::unique_ptr<ModelTensors> tensors_;  ///< the model's and optimizer's, as one named set
  ProgressBar progress_;
  CheckpointStore store_;
  TrainingState state_;  ///< where training stands now (what a checkpoint written now records)
  int64_t test_spin_step_ = -1;  ///< DTRAIN_TEST_SPIN_AT_STEP's step for this worker (test only)
  TrainingState start_;          ///< where this run resumed
  std::string restored_epoch_metrics_;  ///< the restored checkpoint's, for recover_epoch_metrics
  std::string last_epoch_metrics_;      ///< the last finished epoch's (metrics_json with steps)
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> ledger_{nullptr, &std::fclose};
  int64_t skipped_reported_ = 0;  ///< TrainStep::skipped_steps() at the last report_loss_scale
  int64_t resumed_step_ = 0;      ///< global step where this generation (or run) resumed
  bool force_heartbeat_ = false;  ///< the next heartbeat goes out whatever its age
  int64_t steps_per_epoch_ = 0;
  double last_heartbeat_ = -1;
  double last_shown_ = -1;  ///< when totals were last read back
  /// The epoch in progress: when its clock began (monotonic, less any part run before a
  /// re-formation), the samples of its steps done since and the step it began at, for its
  /// seconds, samples_per_second and steps.
  double epoch_started_ = 0, epoch_samples_ = 0;
  int64_t epoch_first_step_ = 0;
  /// What share_whole_state carried of the resumed epoch's clock
  /// (docs/design.md#in-place-recovery): its seconds and samples before this run of it and its
  /// first step (-1: none carried), so its timings cover the whole epoch.
  double carried_epoch_seconds_ = 0, carried_epoch_samples_ = 0;
  int64_t carried_first_step_ = -1;
};

}  // namespace dtrain::train
