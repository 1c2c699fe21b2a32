// The `train` section of a dtrain-worker job, checked by the worker's own parser before anything
// starts, so `dtrain validate` and `dtrain launch` fail on the errors every worker would hit,
// naming the user's job file instead of the run's spec.json: the parse, a mixed policy this
// host's CPU cannot compute when every task trains on it, the worker's start-up rules
// (docs/design.md#preconditions). `dtrain validate`'s look at the data runs in dtrain-worker
// (launcher/cli/in_worker.h).
#pragma once

#include <string>

#include "common/job_spec.h"

namespace dtrain::launcher {

/// Parses spec.train_json as dtrain-worker will (train::parse_train_config), then applies the
/// worker's start-up rules (worker/spec/preconditions.h) where planning can tell the device:
/// "cuda" and "cpu" say so, and "auto" trains on CPUs when every task runs on this host and no
/// GPU is visible here. On CPUs: a mixed policy this host's CPU cannot compute (every task here;
/// unless dtype_policy_fallback allows float32) and "nccl"; on GPUs: the GPU rule; for an elastic
/// job, its rules. Throws ConfigError "<spec.source>: train.<json path>: <what is wrong>", e.g.
/// "job.json: train.model.layers[0].activation: ...", the words the worker would print. Does
/// nothing for a `command` job, whose program owns its own configuration.
void check_train_section(const common::JobSpec& spec);

/// True when every task of the job runs on this host (no Slurm, no other host): the CPU here is
/// the one that trains, and the data here is what the workers read.
bool trains_here(const common::JobSpec& spec);

}  // namespace dtrain::launcher
