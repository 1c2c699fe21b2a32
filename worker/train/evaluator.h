// The "evaluator" task of TensorFlow's tutorials: not part of the training ring; it watches the
// run's backup folder, evaluates each new checkpoint on the test split, appends a line to
// RUN_DIR/eval.jsonl, and when the chief's final model appears evaluates that and exits.
// Reads the files the chief writes, so it needs the chief's file system.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "worker/comm/communicator.h"
#include "worker/data/dataset.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/train/safetensors.h"
#include "worker/train/train_config.h"

namespace dtrain::train {

/// Copies the file's weights (parameters and state, by name) into the model; false when one is
/// missing or misshapen.
bool load_weights(nn::Model& model, const SafetensorsFile& file);

struct EvaluatorOptions {
  std::string run_dir;
  double poll_seconds = 0.5;
  /// True once the evaluator should finish (SIGTERM): it evaluates the final model if it is
  /// there, then returns.
  std::function<bool()> stop_requested;
};

/// Mean loss (plus the regularizers' penalty, as Keras's) and accuracy of model on the whole
/// test split, batch examples at a time (no dropout). With comm (size N), each rank evaluates its
/// share of the batches (contiguous, about 1/N of them) and the per-batch sums are all-reduced;
/// every rank then adds them up in batch order, so the result is the same on every rank and equal
/// to one rank evaluating every batch with the same backend. Per-batch sums stay on the device
/// until one read at the end.
std::pair<double, double> evaluate_model(nn::Model& model, nn::Backend& backend,
                                         const data::Dataset& test, int batch,
                                         comm::Communicator* comm = nullptr,
                                         float label_smoothing = 0);

/// Runs until the final model was evaluated or stop_requested() is true. Returns the number of
/// lines it appended to eval.jsonl.
int run_evaluator(const TrainConfig& config, nn::Backend& backend, const data::Dataset& test,
                  const EvaluatorOptions& options);

}  // namespace dtrain::train
