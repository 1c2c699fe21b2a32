// See recovery_client.h.
#include "worker/train/recovery_client.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace dtrain::train {

RecoveryClient::RecoveryClient(RecoveryOptions options, Factory factory,
                               common::ControlClient& control, common::ProgressRecordWriter* record)
    : options_(std::move(options)),
      factory_(std::move(factory)),
      control_(control),
      record_(record),
      generation_(static_cast<int>(options_.ring.generation)) {
  if (options_.members) {
    members_ = *options_.members;
  } else {
    for (int r = 0; r < options_.ring.size; ++r) members_.push_back(r);
  }
}

RecoveryClient::~RecoveryClient() = default;

comm::RingIdentity RecoveryClient::ring_of(int generation) const {
  comm::RingIdentity ring = elastic() ? comm::members_ring(options_.ring, members_) : options_.ring;
  ring.generation = static_cast<uint32_t>(generation);
  return ring;
}

std::optional<comm::ShardPlan> RecoveryClient::shards() const {
  if (!elastic()) return std::nullopt;
  return comm::shard_plan(members_, options_.ring.rank, options_.ring.size);
}

comm::GroupCommunicator& RecoveryClient::form() {
  auto make = [this](int generation) { return factory_(ring_of(generation)); };
  for (int reforms = 0; !group_; ++reforms) {
    try {
      group_ = std::make_unique<comm::GroupCommunicator>(make, generation_, record_);
    } catch (const comm::GroupBroken& e) {
      // A member failed before the group first formed (killed while it loaded its data, say):
      // in place the group forms again with its replacement, as it does after a step.
      if (!options_.in_place || reforms >= options_.start_reforms) throw;
      spdlog::warn("the group broke before training ({}): asking for the next generation",
                   e.what());
      try {
        // whole_step -1: it holds no state yet, so it says nothing of how far the group got.
        ask_launcher(e.what(), -1, false);
      } catch (const NoRecovery&) {
        throw e;
      }
    }
  }
  return *group_;
}

comm::GroupCommunicator& RecoveryClient::group() {
  DT_ENFORCE(group_ != nullptr, "the recovery client's group is asked for before form()");
  return *group_;
}

void RecoveryClient::ask_launcher(const std::string& what, int64_t whole_step, bool in_flight) {
  common::ReformRequest request{options_.task, options_.attempt, generation_,
                                whole_step,    in_flight,        what};
  std::optional<common::ReformReply> reply =
      control_.request_reform(request, options_.reply_seconds);
  if (!reply) {
    throw NoRecovery(fmt::format("the launcher did not answer the reform request within {:.0f} s",
                                 options_.reply_seconds));
  }
  if (!reply->ok) throw NoRecovery(fmt::format("no recovery in place: {}", reply->error));
  if (elastic()) {
    members_ = common::parse_members(reply->members, options_.ring.size, "reform reply");
  }
  generation_ = reply->generation;
}

Position RecoveryClient::rejoin(const std::string& what, bool in_flight, ModelTensors& tensors,
                                const HeldState& held) {
  if (!options_.in_place) throw NoRecovery("no recovery in place in this worker");
  comm::GroupCommunicator& broken = group();
  broken.leave(what);
  ask_launcher(what, held.global_step, in_flight);
  if (elastic()) {
    spdlog::info("joining generation {} with members {}", generation_,
                 common::format_members(members_));
  } else {
    spdlog::info("joining generation {}", generation_);
  }
  broken.join(generation_);
  return share_whole_state(broken, tensors, held);
}

}  // namespace dtrain::train
