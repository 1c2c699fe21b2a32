// The fit loop: epochs of steps (batch -> forward -> loss -> backward -> ONE all-reduce of the
// flat gradient buffer -> optimizer), validation on the test split, Keras-style progress,
// heartbeats to the launcher, and metrics.jsonl from the chief. Sees a Backend and a
// Communicator, nothing else of the machine. Single-threaded (the batcher prefetches on its own).
#pragma once

#include <memory>
#include <string>

#include "common/control_protocol.h"
#include "worker/comm/communicator.h"
#include "worker/data/dataset.h"
#include "worker/nn/backend.h"
#include "worker/nn/sequential.h"
#include "worker/train/optimizer.h"
#include "worker/train/progress.h"
#include "worker/train/train_config.h"

namespace dtrain::train {

struct EpochMetrics {
  int epoch = 0;  ///< 1-based, as printed
  double loss = 0, accuracy = 0;
  double val_loss = 0, val_accuracy = 0;
  bool validated = false;
  double seconds = 0, samples_per_second = 0;
};

struct TrainerOptions {
  std::string run_dir;  ///< metrics.jsonl goes here (chief only)
  bool chief = true;
  std::string task = "worker:0";  ///< for heartbeats
  int attempt = 0;
};

class Trainer {
 public:
  /// None of the references are owned; all must outlive the trainer. control may be null.
  Trainer(const TrainConfig& config, nn::Backend& backend, comm::Communicator& comm,
          data::Dataset train, data::Dataset test, TrainerOptions options,
          common::ControlClient* control);
  ~Trainer();

  /// Trains every epoch; returns the last epoch's metrics. Throws IoError from the communicator
  /// or the batcher, ConfigError for shapes that do not fit.
  EpochMetrics fit();
  /// Mean loss and accuracy of the model on the test split (no dropout).
  std::pair<double, double> evaluate();

  nn::Sequential& model() { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }

 private:
  EpochMetrics train_epoch(int epoch);
  void write_metrics(const EpochMetrics& m);
  void heartbeat(int epoch, int64_t step, int64_t steps, double loss, double accuracy, double rate);

  const TrainConfig& config_;
  nn::Backend& backend_;
  comm::Communicator& comm_;
  data::Dataset train_, test_;
  TrainerOptions options_;
  common::ControlClient* control_;
  std::unique_ptr<nn::Sequential> model_;
  std::unique_ptr<Optimizer> optimizer_;
  ProgressBar progress_;
  int64_t steps_per_epoch_ = 0;
  double last_heartbeat_ = -1;
};

}  // namespace dtrain::train
