// See membership.h.
#include "worker/comm/membership.h"

#include <algorithm>

#include "common/errors.h"

namespace dtrain::comm {
namespace {

size_t place_of(const std::vector<int>& members, int full_rank) {
  auto at = std::find(members.begin(), members.end(), full_rank);
  DT_ENFORCE(at != members.end(), "ring rank {} is not a member of its generation", full_rank);
  return static_cast<size_t>(at - members.begin());
}

}  // namespace

RingIdentity members_ring(const RingIdentity& full, const std::vector<int>& members) {
  RingIdentity ring = full;
  ring.rank = static_cast<int>(place_of(members, full.rank));
  ring.size = static_cast<int>(members.size());
  ring.names.clear();
  ring.addresses.clear();
  for (int m : members) {
    DT_ENFORCE(m >= 0 && m < full.size, "member {} of a ring of {}", m, full.size);
    ring.names.push_back(full.names[static_cast<size_t>(m)]);
    ring.addresses.push_back(full.addresses[static_cast<size_t>(m)]);
  }
  return ring;
}

ShardPlan shard_plan(const std::vector<int>& members, int full_rank, int virtual_size) {
  size_t i = place_of(members, full_rank);
  int next = i + 1 < members.size() ? members[i + 1] : members.front() + virtual_size;
  DT_ENFORCE(next > full_rank && next - full_rank <= virtual_size, "members of a ring of {}",
             virtual_size);
  return ShardPlan{virtual_size, full_rank, next - full_rank};
}

}  // namespace dtrain::comm
