// BackupAndRestore checkpoints and the final model, as safetensors files (safetensors.h) so
// Python tools can open them. Writes are atomic (temp file, fsync, rename, fsync folder; then
// the index the same way); reads verify a checksum and skip damaged files. Knows files, not
// training.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "worker/train/safetensors.h"

namespace dtrain::train {

/// Where training stands, besides the tensors.
struct TrainingState {
  int64_t epoch = 0;        ///< epoch to resume in (0-based)
  int64_t step = 0;         ///< first step of that epoch still to run
  int64_t global_step = 0;  ///< steps run in total
  int64_t optimizer_iterations = 0;
  double epoch_loss_sum = 0, epoch_correct = 0,
         epoch_seen = 0;  ///< the resumed epoch's running metrics
  /// A dynamic loss scale (docs/design.md#loss-scaling) and its count of finite steps; 0 when
  /// there is none (not recorded: a run without one, or a checkpoint from before loss scaling).
  double loss_scale = 0;
  int64_t loss_scale_good_steps = 0;
  /// The resumed epoch's clock: seconds trained and samples seen in it so far, and the step it
  /// was entered at (its metrics time the whole epoch, not only the part after a resume; a stop
  /// at its last step would otherwise record an epoch of no time). -1: not recorded (a checkpoint
  /// at an epoch's end, or from before the clock was kept).
  double epoch_seconds = 0, epoch_samples = 0;
  int64_t epoch_first_step = -1;
};

struct LoadedCheckpoint {
  std::string path;
  TrainingState state;
  SafetensorsFile file;
  std::string epoch_metrics;  ///< what save() was given as such (empty when nothing)
  std::string dtype_policy;   ///< the policy it was trained under ("float32" when unrecorded)
};

/// Copies each tensor of into (views of host memory the caller owns) from the checkpoint. A
/// tensor of another shape, or a missing weight, is a ConfigError naming the file, the tensor
/// and both shapes: the checksum proves the file is whole, not that it fits. A missing optimizer
/// slot (the optimizer changed) starts from zero, with a warning.
void restore_tensors(const LoadedCheckpoint& checkpoint, const std::vector<TensorView>& into);

/// The backup folder of a run: ckpt-<global step>.safetensors files and checkpoint.json.
/// Only regular files count as checkpoints; anything else there is reported once and left alone.
class CheckpointStore {
 public:
  CheckpointStore(std::string dir, int keep);

  /// Writes a checkpoint of state and tensors for a model of architecture (JSON text), updates
  /// the index and deletes this model's older checkpoints beyond the newest `keep` (files of
  /// other models, or of later steps, are never deleted: see prune). Returns its path. Throws
  /// IoError, or ConfigError when a folder has the checkpoint's name. epoch_metrics (opaque text,
  /// e.g. the finished epoch's metrics) is kept in the metadata and comes back with the load.
  std::string save(const TrainingState& state, const std::vector<TensorView>& tensors,
                   const std::string& architecture, const std::string& epoch_metrics = {});
  /// The newest checkpoint that verifies, is for architecture and has epoch and step in range;
  /// each one skipped is logged with its reason. nullopt when there is none.
  std::optional<LoadedCheckpoint> load_latest(const std::string& architecture) const;
  /// Removes the checkpoints, the index and their temporaries, then the folder if it is empty;
  /// nothing else.
  void remove_all();
  const std::string& dir() const { return dir_; }
  /// The dtype policy (train.dtype_policy) later checkpoints record; "float32" records nothing.
  void set_dtype_policy(std::string policy) { dtype_policy_ = std::move(policy); }
  /// The class names (label i is class_names[i]; the directory source's) later checkpoints record
  /// as "class_names", a JSON list; empty records nothing.
  void set_class_names(std::vector<std::string> class_names) {
    class_names_ = std::move(class_names);
  }

 private:
  std::vector<std::string> candidates() const;
  std::vector<std::string> prune(const std::string& written, const std::string& architecture);
  std::string dir_;
  int keep_;
  std::string dtype_policy_ = "float32";
  std::vector<std::string> class_names_;
  mutable std::set<std::string> reported_;  ///< names already warned about, to warn once
};

/// Writes RUN_DIR/model/model.safetensors (weights; metadata: architecture, dtype_policy unless
/// it is float32, class_names unless empty, vocabulary unless empty) and model.json (the
/// architecture, after "dtype_policy" unless it is float32, "class_names" unless empty and
/// "vocabulary" unless empty: docs/model-format.md).
void write_final_model(const std::string& model_dir, const std::vector<TensorView>& weights,
                       const std::string& architecture_json,
                       const std::string& dtype_policy = "float32",
                       const std::vector<std::string>& class_names = {},
                       const std::string& vocabulary_json = {});

/// A text source's vocabulary as model.json and the final model's metadata record it, so that
/// sampling and PyTorch can decode: {"kind": "characters", "symbols": [each id's text]},
/// {"kind": "bytes"} or {"kind": "tokens", "size": V}; "" for images.
std::string vocabulary_json(const std::string& kind, const std::vector<std::string>& symbols,
                            int size);

/// The final model at model_path (RUN_DIR/model/model.safetensors) as the checkpoint of finished
/// training (docs/design.md#checkpoint-format): when it was written after launched_path (the
/// launch's spec.json), so by this launch, whose training had therefore ended, and for
/// architecture. Its weights, with state finished. nullopt otherwise (a damaged file is logged).
std::optional<LoadedCheckpoint> load_finished_model(const std::string& model_path,
                                                    const std::string& launched_path,
                                                    const std::string& architecture,
                                                    const TrainingState& finished);

}  // namespace dtrain::train
