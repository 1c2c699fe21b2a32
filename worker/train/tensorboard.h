// Keras's TensorBoard callback, for the chief: epoch_* scalars in <log_dir>/train/ and the
// validation's (its val_ prefix stripped, as Keras does) in <log_dir>/validation/, both at the
// 0-based epoch as step, and batch_* scalars every update_freq steps at the global step. Tags
// and steps only; the event files are event_file.h's. It reads nothing from the device: the
// trainer hands it host numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/spec/train_config.h"
#include "worker/train/event_file.h"

namespace dtrain::train {

/// Named values as Keras's `logs` dict holds them ("loss", "val_loss", "learning_rate", ...).
using SummaryLogs = std::vector<std::pair<std::string, double>>;

class TensorBoardLog {
 public:
  /// Opens one new file in <run_dir>/<spec.log_dir>/train/, and in validation/ when the run
  /// validates (a restarted attempt adds files beside the old ones: TensorBoard reads them all).
  /// Never throws for I/O (see EventFileWriter).
  TensorBoardLog(const TensorBoardSpec& spec, const std::string& run_dir, bool validation);

  /// True when Keras's update_freq asks for batch summaries after this global step (steps done
  /// since training began, counted from 1): a multiple of update_freq; never for "epoch".
  bool wants_batch(int64_t global_step) const;
  /// batch_<name> in train/ at global_step; logs hold the epoch's running means so far.
  void log_batch(int64_t global_step, const SummaryLogs& logs);
  /// evaluation_<name>_vs_iterations in validation/ at the optimizer's iterations, as Keras
  /// writes after each evaluation; names without the val_ prefix.
  void log_evaluation(int64_t iterations, const SummaryLogs& logs);
  /// epoch_<name> at step epoch (0-based): val_ names in validation/ without the prefix, the
  /// rest in train/. Then flushes both files.
  void log_epoch(int64_t epoch, const SummaryLogs& logs);
  /// Writes what is buffered. Also done by log_epoch, by log_batch when the last flush is
  /// kFlushSeconds old (TF's default flush_millis), and on destruction.
  void flush();

  static constexpr double kFlushSeconds = 120;

 private:
  TensorBoardSpec spec_;
  std::unique_ptr<EventFileWriter> train_, validation_;
  double last_flush_ = 0;  ///< monotonic seconds
};

}  // namespace dtrain::train
