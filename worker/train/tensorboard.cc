// See tensorboard.h. Values are written as float32, as tf.summary.scalar does.
#include "worker/train/tensorboard.h"

#include <spdlog/spdlog.h>

#include "common/clock.h"

namespace dtrain::train {
namespace {

std::vector<ScalarValue> scalars(const std::string& prefix, const SummaryLogs& logs,
                                 const std::string& suffix = "") {
  std::vector<ScalarValue> values;
  for (const auto& [name, value] : logs)
    values.push_back({prefix + name + suffix, static_cast<float>(value)});
  return values;
}

}  // namespace

TensorBoardLog::TensorBoardLog(const TensorBoardSpec& spec, const std::string& run_dir,
                               bool validation)
    : spec_(spec), last_flush_(common::monotonic_seconds()) {
  const std::string root = run_dir + "/" + spec_.log_dir;
  train_ = std::make_unique<EventFileWriter>(root + "/train");
  if (validation) validation_ = std::make_unique<EventFileWriter>(root + "/validation");
  if (!train_->failed()) {
    spdlog::info("tensorboard: summaries in {} (tensorboard --logdir {})", train_->path(), root);
  }
}

bool TensorBoardLog::wants_batch(int64_t global_step) const {
  return spec_.update_every_steps > 0 && global_step % spec_.update_every_steps == 0;
}

void TensorBoardLog::log_batch(int64_t global_step, const SummaryLogs& logs) {
  train_->add(encode_scalar_event(wall_time_now(), global_step, scalars("batch_", logs)));
  if (common::monotonic_seconds() - last_flush_ >= kFlushSeconds) flush();
}

void TensorBoardLog::log_evaluation(int64_t iterations, const SummaryLogs& logs) {
  if (!validation_) return;
  validation_->add(encode_scalar_event(wall_time_now(), iterations,
                                       scalars("evaluation_", logs, "_vs_iterations")));
}

void TensorBoardLog::log_epoch(int64_t epoch, const SummaryLogs& logs) {
  SummaryLogs train, validation;
  for (const auto& [name, value] : logs) {
    if (name.rfind("val_", 0) == 0) {
      validation.emplace_back(name.substr(4), value);
    } else {
      train.emplace_back(name, value);
    }
  }
  double now = wall_time_now();
  train_->add(encode_scalar_event(now, epoch, scalars("epoch_", train)));
  if (validation_ && !validation.empty())
    validation_->add(encode_scalar_event(now, epoch, scalars("epoch_", validation)));
  flush();
}

void TensorBoardLog::flush() {
  train_->flush();
  if (validation_) validation_->flush();
  last_flush_ = common::monotonic_seconds();
}

}  // namespace dtrain::train
