// The `train` section of a dtrain-worker job, checked by the worker's own parser before anything
// starts, so `dtrain validate` and `dtrain launch` fail on the errors every worker would hit,
// naming the user's job file instead of the run's spec.json. Parsing only: no data files read,
// no device opened.
#pragma once

#include "common/job_spec.h"

namespace dtrain::launcher {

/// Parses spec.train_json as dtrain-worker will (train::parse_train_config). Throws ConfigError
/// "<spec.source>: train.<json path>: <what is wrong>", e.g. "job.json:
/// train.model.layers[0].activation: ...". Does nothing for a `command` job, whose program owns
/// its own configuration.
void check_train_section(const common::JobSpec& spec);

}  // namespace dtrain::launcher
