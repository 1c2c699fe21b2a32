// The "evaluator" task of TensorFlow's tutorials: not part of the training ring; it watches the
// run's backup folder, evaluates each new checkpoint on the test split, appends a line to
// RUN_DIR/eval.jsonl, and when the chief's final model appears evaluates that and exits.
// Reads the files the chief writes, so it needs the chief's file system.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/data/dataset.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/loss.h"
#include "worker/train/safetensors.h"

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

/// What a validation pass gives: the mean loss, the loss's companion metric (accuracy for the
/// cross-entropies) and each of train.metrics, in its order.
struct Scores {
  double loss = 0;
  double companion = 0;
  std::vector<double> metrics;
};

/// Mean loss (plus the regularizers' penalty, as Keras's), its companion and metrics of model on
/// the whole test split, batch examples at a time (no dropout). With comm (size N), each rank
/// evaluates its share of the batches (contiguous, about 1/N of them) and the per-batch sums are
/// all-reduced; every rank then adds them up in batch order, so the result is the same on every
/// rank and equal to one rank evaluating every batch with the same backend. The loss's sums stay
/// on the device until one read at the end; metrics read each batch's outputs.
Scores evaluate_model(nn::Model& model, nn::Backend& backend, const data::Dataset& test, int batch,
                      comm::Communicator* comm = nullptr, const LossOptions& loss = {},
                      const std::vector<MetricSpec>& metrics = {});

/// scores by name, in Keras's order: prefix + "loss", prefix + the companion, prefix + each metric
/// ("val_loss", "val_accuracy", ... with prefix "val_").
std::vector<std::pair<std::string, double>> named_scores(const TrainConfig& config,
                                                         const Scores& scores,
                                                         const std::string& prefix);

/// Runs until the final model was evaluated or stop_requested() is true. Returns the number of
/// lines it appended to eval.jsonl.
int run_evaluator(const TrainConfig& config, nn::Backend& backend, const data::Dataset& test,
                  const EvaluatorOptions& options);

}  // namespace dtrain::train
