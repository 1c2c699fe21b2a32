// The `train` section of a dtrain-worker job as the launcher's plan uses it, read once by the
// worker's own reader (worker/spec/train_config.h, docs/design.md#one-reading-of-a-job): the
// device and transport recovery in place depends on, and the folder checkpoints go to. No key is
// read by hand.
#pragma once

#include <optional>

#include "common/job_spec.h"
#include "worker/spec/train_config.h"

namespace dtrain::launcher {

/// spec's train section parsed as dtrain-worker parses it, or nullopt for a `command` job, a job
/// without one, or one that does not parse: check_train_section (train_check.h) names that
/// error before a launch, and the plan then takes the worker's defaults.
std::optional<train::TrainConfig> read_train_section(const common::JobSpec& spec);

}  // namespace dtrain::launcher
