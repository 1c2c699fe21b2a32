// What a dtrain-worker job asks of where it trains, refused before anything runs
// (docs/design.md#preconditions): the worker checks at start-up on the device it chose, and the
// launcher (`dtrain validate`, `dtrain launch`) checks the same rules at planning on the device
// it can tell the worker will choose, so a job is refused once, with the same words, before a
// launch. Each check throws ConfigError "<source>: train.<key>: <why>; <what to set>".
#pragma once

#include <string>

#include "worker/spec/train_config.h"

namespace dtrain::train {

/// The GPU rule (docs/design.md#the-model-as-a-graph): what has not passed its parity test on a
/// GPU does not run on one: a layer kind (or its keys), label smoothing, a loss other than
/// sparse categorical cross-entropy, weight_decay, clipnorm and global_clipnorm.
void check_gpu_rule(const TrainConfig& config, const std::string& source);

/// train.communication "nccl" where the job trains on CPUs (on_gpu false): NCCL sums GPU memory
/// only.
void check_transport(const TrainConfig& config, bool on_gpu, const std::string& source);

/// An elastic job (docs/design.md#elastic-membership): the TCP ring (a member sums virtual
/// shards in its order), on the host (on_gpu false), every example reachable by every member
/// (shard_policy "data"), and no layer that takes statistics over the group in step
/// (synchronized batch normalization).
void check_elastic(const TrainConfig& config, bool on_gpu, const std::string& source);

}  // namespace dtrain::train
