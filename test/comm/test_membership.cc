// Elastic membership's arithmetic (worker/comm/membership.h): the members' ring, and the virtual
// shards each member holds. For every membership of small clusters the members' blocks cover the
// V virtual ranks once each, in ring order, each member holding its own rank.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "worker/comm/membership.h"

using namespace dtrain;
using comm::ShardPlan;

namespace {

comm::RingIdentity full_ring(int size, int rank) {
  comm::RingIdentity ring;
  ring.job = "j";
  ring.attempt = 1;
  ring.generation = 3;
  ring.token = "t";
  ring.rank = rank;
  ring.size = size;
  for (int r = 0; r < size; ++r) {
    ring.names.push_back("worker:" + std::to_string(r));
    ring.addresses.push_back("h" + std::to_string(r) + ":1");
  }
  return ring;
}

// The virtual ranks members hold, member by member in ring order.
std::vector<int> shards_in_ring_order(const std::vector<int>& members, int virtual_size) {
  std::vector<int> shards;
  for (int m : members) {
    ShardPlan plan = comm::shard_plan(members, m, virtual_size);
    CHECK(plan.virtual_size == virtual_size);
    CHECK(plan.first == m);
    CHECK(plan.shard(0) == m);  // its own shard first
    for (int j = 0; j < plan.held; ++j) shards.push_back(plan.shard(j));
  }
  return shards;
}

}  // namespace

TEST_CASE("shard_plan: examples of three members of four, two of four, and one") {
  ShardPlan a = comm::shard_plan({0, 2, 3}, 0, 4);
  CHECK((a.first == 0 && a.held == 2));
  CHECK(comm::shard_plan({0, 2, 3}, 2, 4).held == 1);
  CHECK(comm::shard_plan({0, 2, 3}, 3, 4).held == 1);
  ShardPlan wraps = comm::shard_plan({1, 3}, 3, 4);  // holds 3 and 0
  CHECK(wraps.held == 2);
  CHECK(wraps.shard(0) == 3);
  CHECK(wraps.shard(1) == 0);
  ShardPlan alone = comm::shard_plan({2}, 2, 4);
  CHECK(alone.held == 4);
  CHECK(std::vector<int>{alone.shard(0), alone.shard(1), alone.shard(2), alone.shard(3)} ==
        std::vector<int>{2, 3, 0, 1});
  CHECK_FALSE(alone.full(1));
  ShardPlan everyone = comm::shard_plan({0, 1, 2}, 1, 3);
  CHECK(everyone.held == 1);
  CHECK(everyone.full(3));
  CHECK_FALSE(comm::shard_plan({0, 2}, 0, 3).full(2));
}

TEST_CASE("shard_plan: every membership covers the virtual ranks once each, in ring order") {
  for (int v = 1; v <= 7; ++v) {
    for (int mask = 1; mask < (1 << v); ++mask) {
      std::vector<int> members;
      for (int r = 0; r < v; ++r)
        if (mask & (1 << r)) members.push_back(r);
      INFO("V " << v << ", members mask " << mask);
      std::vector<int> shards = shards_in_ring_order(members, v);
      REQUIRE(shards.size() == static_cast<size_t>(v));
      for (int i = 0; i < v; ++i) CHECK(shards[static_cast<size_t>(i)] == (members[0] + i) % v);
      bool all = static_cast<int>(members.size()) == v;
      CHECK(comm::shard_plan(members, members.back(), v).full(static_cast<int>(members.size())) ==
            all);
    }
  }
}

TEST_CASE("shard_plan: a rank that is not a member, or members out of order, is a bug") {
  CHECK_THROWS_AS(comm::shard_plan({0, 2}, 1, 4), common::EnforceError);
  CHECK_THROWS_WITH(comm::shard_plan({0, 2}, 1, 4), Catch::Contains("ring rank 1 is not a member"));
  CHECK_THROWS_AS(comm::shard_plan({2, 0}, 2, 4), common::EnforceError);
  CHECK_THROWS_AS(comm::shard_plan({}, 0, 4), common::EnforceError);
}

TEST_CASE("members_ring: the members' ranks, names and addresses; the rest of the identity kept") {
  comm::RingIdentity ring = comm::members_ring(full_ring(4, 2), {0, 2, 3});
  CHECK(ring.rank == 1);
  CHECK(ring.size == 3);
  CHECK(ring.names == std::vector<std::string>{"worker:0", "worker:2", "worker:3"});
  CHECK(ring.addresses == std::vector<std::string>{"h0:1", "h2:1", "h3:1"});
  CHECK(ring.describe(ring.next()) == "worker:3 (rank 2)");
  CHECK(ring.job == "j");
  CHECK(ring.attempt == 1);
  CHECK(ring.generation == 3);
  CHECK(ring.token == "t");

  comm::RingIdentity alone = comm::members_ring(full_ring(4, 3), {3});
  CHECK(alone.rank == 0);
  CHECK(alone.size == 1);
  CHECK(alone.names == std::vector<std::string>{"worker:3"});
  comm::RingIdentity all = comm::members_ring(full_ring(3, 1), {0, 1, 2});
  CHECK(all.rank == 1);
  CHECK(all.names == full_ring(3, 1).names);
}

TEST_CASE("members_ring: a non-member, or a member outside the ring, is a bug") {
  CHECK_THROWS_AS(comm::members_ring(full_ring(4, 1), {0, 2, 3}), common::EnforceError);
  CHECK_THROWS_WITH(comm::members_ring(full_ring(4, 1), {0, 2, 3}),
                    Catch::Contains("ring rank 1 is not a member"));
  CHECK_THROWS_AS(comm::members_ring(full_ring(4, 0), {0, 5}), common::EnforceError);
  CHECK_THROWS_AS(comm::members_ring(full_ring(4, 0), {-1, 0}), common::EnforceError);
}
