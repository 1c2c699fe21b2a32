// A member's whole state as the group shares it (docs/design.md#the-workers-recovery-client):
// the model's named set (parameters, non-trainable state, optimizer slots and the callbacks' host
// tensors, ModelTensors) and the position the trainer trains from. Every start and every
// re-formation agrees on the newest one and broadcasts it; whatever the named set and
// TrainingState hold travels, so nothing here names a tensor or a field. It does not know where a
// state comes from (the trainer, a checkpoint) nor what the trainer does with it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "worker/comm/communicator.h"
#include "worker/train/checkpoint.h"
#include "worker/train/model_tensors.h"

namespace dtrain::train {

/// Where training stands, as a member sends it with the named set: TrainingState whole (epoch,
/// step, global step, optimizer count, the epoch's running totals and clock, the loss scale, as
/// the trainer fills them) and the last finished epoch's metrics line (empty: none).
struct Position {
  TrainingState state;
  std::string epoch_metrics;
};

/// What one member offers to share_whole_state.
struct HeldState {
  /// False: this member holds no state yet (a process that has just started).
  bool holding = false;
  /// Where the state it holds stands (when holding): positions compare by global step, then
  /// epoch, then step.
  int64_t global_step = 0, epoch = 0, step = 0;
  /// Its Position (asked only of the member that sends its own state, once its named set's host
  /// copies are downloaded).
  std::function<Position()> position = nullptr;
  /// Asked of every member when none holds a state: rank 0's answer is sent (a checkpoint it read
  /// into the named set's host copies; nullopt: the initial state its host copies hold).
  std::function<std::optional<Position>()> stored = nullptr;
};

/// Every member says where the state it holds stands (an all-gather); the newest is broadcast by
/// the lowest rank holding it, or rank 0's stored state when no one holds one: its Position, then
/// every tensor of tensors in the named set's order. Each member first downloads its own tensors
/// (sizing the host copies); on return the host copies are the shared state and uploaded to the
/// device wherever they came from elsewhere (a receiver, or a sender of a stored state). Returns
/// the shared Position. Collective: every member of comm calls it at once, with named sets of the
/// same model; comm's IoError (comm::GroupBroken in a group) propagates.
Position share_whole_state(comm::Communicator& comm, ModelTensors& tensors, const HeldState& held);

}  // namespace dtrain::train
