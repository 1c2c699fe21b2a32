// One worker's training run in this process (SoloCommunicator, oneDNN), for the trainer's tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/train/trainer.h"

namespace dtrain::common {
class ControlClient;
}

namespace dtrain::testing {

struct SoloFitOptions {
  int stop_after = 0;  ///< > 0: the stop poll says "stop" at its stop_after-th call (fit throws
                       ///< train::Preempted a step later, after a step checkpoint)
  common::ControlClient* control = nullptr;  ///< reports go here when set
  int64_t* resumed_at = nullptr;             ///< set to the global step the run resumed from
  train::EpochMetrics* last = nullptr;       ///< set to the last epoch's metrics
  bool warm = false;  ///< the trainer adopts warm_model_parts (a promoted spare's), made first
};

/// Trains c in run_dir as worker:0 of one and returns the final weights.
std::vector<float> solo_fit(const train::TrainConfig& c, const std::string& run_dir,
                            const SoloFitOptions& options = {});

}  // namespace dtrain::testing
