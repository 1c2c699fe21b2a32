// See whole_state.h.
#include "worker/train/whole_state.h"

#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"

namespace dtrain::train {

// TrainingState travels as its bytes: every member runs the same program, so it is laid out
// alike on every one, and a field added to it travels with no change here.
static_assert(std::is_trivially_copyable_v<TrainingState>, "TrainingState travels as its bytes");

namespace {

// The rank whose state every member takes: the newest position (-1 for a member holding none),
// the lowest rank among equals; -1 when no member holds one.
int newest_holder(comm::Communicator& comm, const HeldState& held) {
  std::array<int64_t, 3> mine = {-1, -1, -1};
  if (held.holding) mine = {held.global_step, held.epoch, held.step};
  std::vector<uint8_t> all = comm.all_gather(mine.data(), sizeof mine);
  std::array<int64_t, 3> best = {-1, -1, -1};
  int source = -1;
  for (int r = 0; r < comm.size(); ++r) {
    std::array<int64_t, 3> theirs{};
    std::memcpy(theirs.data(), all.data() + static_cast<size_t>(r) * sizeof theirs, sizeof theirs);
    if (theirs > best) best = theirs, source = r;
  }
  return source;
}

}  // namespace

Position share_whole_state(comm::Communicator& comm, ModelTensors& tensors, const HeldState& held) {
  int source = newest_holder(comm, held);
  const bool stored = source < 0;  // a fresh group: rank 0's stored state, or the initial one
  if (stored) source = 0;
  tensors.download();  // this member's state, on the host: the buffers to send or receive into
  Position position;
  if (stored) {
    DT_ENFORCE(held.stored != nullptr, "no member holds a state and none is stored");
    if (std::optional<Position> found = held.stored()) position = std::move(*found);
  } else if (comm.rank() == source) {
    position = held.position();
  }
  comm.broadcast(&position.state, sizeof position.state, source);
  for (std::vector<float>& tensor : tensors.host())
    comm.broadcast(tensor.data(), tensor.size() * sizeof(float), source);
  uint64_t length = position.epoch_metrics.size();
  comm.broadcast(&length, sizeof length, source);
  DT_ENFORCE(length <= common::kMaxJsonFileBytes, "epoch metrics of {} bytes", length);
  position.epoch_metrics.resize(length);
  comm.broadcast(position.epoch_metrics.data(), length, source);
  if (comm.rank() != source || stored) tensors.upload();
  return position;
}

}  // namespace dtrain::train
