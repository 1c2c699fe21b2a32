// Elastic membership (docs/design.md#elastic-membership): a generation may train with only some
// of the cluster's ring ranks, its *members*. The ring a member joins is then the members' ring
// (its rank is its place among them), and the global batch keeps its V = cluster-size virtual
// shards, each held by exactly one member: member i holds the virtual ranks from its own ring
// rank up to the next member's (the last wraps around to the first's), so a member never loses
// its own shard and the blocks follow the members' ring order, as the sharded all-reduce needs.
#pragma once

#include <vector>

#include "worker/comm/ring_identity.h"

namespace dtrain::comm {

/// The virtual shards this member holds: `held` consecutive virtual ranks of a virtual ring of
/// virtual_size, from `first` (mod virtual_size).
struct ShardPlan {
  int virtual_size = 1;
  int first = 0;
  int held = 1;

  /// One shard, and every rank a member: the group trains as it would without elasticity.
  bool full(int size) const { return held == 1 && virtual_size == size; }
  /// Virtual rank of this member's j-th shard.
  int shard(int j) const { return (first + j) % virtual_size; }
};

/// full's ring (every rank of the cluster) cut down to members (ring ranks, ascending, full.rank
/// among them): rank becomes full.rank's place among the members, size their count, names and
/// addresses theirs. EnforceError when full.rank is not a member.
RingIdentity members_ring(const RingIdentity& full, const std::vector<int>& members);

/// The shards of the member with ring rank full_rank (ascending members, full_rank among them)
/// when the cluster has virtual_size ranks.
ShardPlan shard_plan(const std::vector<int>& members, int full_rank, int virtual_size);

}  // namespace dtrain::comm
