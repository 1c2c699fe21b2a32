// The asynchronous gradient all-reduce: ThreadedCommunicator over RingCommunicator over the
// in-process link (ranks as threads) against a second ring of plain RingCommunicators as the
// oracle, bit for bit; draining before blocking collectives; abort, time-out and destruction (on
// the link's simulated time: order and outcome, no durations); and HostStagedCommunicator over the
// host device. Not the TCP link or a GPU: those have their own.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "test/comm/in_process_link.h"
#include "worker/comm/host_staged_communicator.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/threaded_communicator.h"
#include "worker/mem/device.h"

using namespace dtrain::comm;
using dtrain::common::EnforceError;
using dtrain::common::IoError;
using dtrain::testing::InProcessLink;
using dtrain::testing::InProcessRing;
using dtrain::testing::LinkTime;
using dtrain::testing::make_in_process_ring;
using Clock = std::chrono::steady_clock;

namespace {

using Buckets = std::vector<std::vector<float>>;  // one rank's buckets
using PerRank = std::vector<Buckets>;

const std::vector<size_t> kBucketSizes = {0, 1, 1009, 100000, 7};

// A ring of communicators, each rank's in-process link (owned inside them) for checks, and the
// links' shared state (their time, who waits, time-outs), which outlives a destroyed communicator.
struct World {
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<InProcessLink*> links;
  std::shared_ptr<InProcessRing> ring;
};

enum class Wrap { kPlain, kThreaded };

World make_world(int size, Wrap wrap, std::chrono::milliseconds timeout = std::chrono::seconds(5),
                 LinkTime time = LinkTime::kWall) {
  World world;
  world.ring = std::make_shared<InProcessRing>(size, time);
  auto links = make_in_process_ring(world.ring, timeout);
  for (int rank = 0; rank < size; ++rank) {
    world.links.push_back(&dynamic_cast<InProcessLink&>(*links[rank]));
    std::unique_ptr<Communicator> comm =
        std::make_unique<RingCommunicator>(std::move(links[rank]), rank, size);
    if (wrap == Wrap::kThreaded) comm = std::make_unique<ThreadedCommunicator>(std::move(comm));
    world.comms.push_back(std::move(comm));
  }
  return world;
}

// Runs body(rank) on one thread per rank; a rank that throws aborts its communicator so the others
// fail fast. The first error is rethrown here.
template <typename Body>
void run_ranks(World& world, Body body) {
  const size_t size = world.comms.size();
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (size_t rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(static_cast<int>(rank), *world.comms[rank]);
      } catch (const std::exception& e) {
        errors[rank] = std::current_exception();
        world.comms[rank]->abort(e.what());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

// Every send was received: no rank made more link calls than its neighbour.
void check_paired(const World& world) {
  for (size_t rank = 0; rank < world.links.size(); ++rank) {
    CAPTURE(rank);
    CHECK(world.links[rank]->unread_calls() == 0);
  }
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Magnitudes 1e-3 .. 1e3 and both signs, so the order of float additions shows in the bits.
float input_value(int rank, size_t bucket, size_t index) {
  static constexpr float kScales[] = {1e-3f, 1e-2f, 1e-1f, 1.0f, 1e1f, 1e2f, 1e3f};
  const uint64_t h = mix((uint64_t(rank) << 48) ^ (uint64_t(bucket) << 32) ^ index);
  const float value = (1.0f + float(h >> 40) / 16777216.0f) * kScales[(h >> 8) % 7];
  return (h & 1) ? -value : value;
}

PerRank make_inputs(int size) {
  PerRank inputs(size);
  for (int rank = 0; rank < size; ++rank) {
    for (size_t bucket = 0; bucket < kBucketSizes.size(); ++bucket) {
      inputs[rank].emplace_back(kBucketSizes[bucket]);
      for (size_t i = 0; i < kBucketSizes[bucket]; ++i)
        inputs[rank][bucket][i] = input_value(rank, bucket, i);
    }
  }
  return inputs;
}

// The oracle: plain RingCommunicators' blocking all_reduce of the buckets, last bucket first (the
// order backward produces them and the tests start them in).
PerRank reduce_with_plain_ring(const PerRank& inputs, ReduceOp op) {
  PerRank data = inputs;
  World world = make_world(static_cast<int>(inputs.size()), Wrap::kPlain);
  run_ranks(world, [&](int rank, Communicator& comm) {
    for (size_t b = data[rank].size(); b-- > 0;)
      comm.all_reduce(data[rank][b].data(), data[rank][b].size(), op);
  });
  check_paired(world);
  return data;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Checks every rank's buckets against the oracle, bit for bit, and the oracle against the inputs
// (a communicator that did nothing must not pass).
void check_buckets(const PerRank& got, const PerRank& expected, const PerRank& inputs) {
  for (size_t rank = 0; rank < got.size(); ++rank) {
    for (size_t b = 0; b < got[rank].size(); ++b) {
      CAPTURE(rank, b);
      CHECK(same_bits(got[rank][b], expected[rank][b]));
      CHECK(same_bits(expected[rank][b], expected[0][b]));
      if (!inputs[rank][b].empty()) CHECK_FALSE(same_bits(expected[rank][b], inputs[rank][b]));
    }
  }
}

// Waits for done() to hold; false after a minute, a guard so that a test fails instead of hanging.
template <typename Done>
bool wait_for(Done done) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!done() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

std::string error_of(Communicator& comm, ReduceTicket ticket) {
  try {
    comm.finish_all_reduce(ticket);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("started all-reduces equal the blocking ring's, bit for bit, on every rank") {
  for (int size : {2, 3}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      for (bool finish_in_start_order : {true, false}) {
        const bool mean = op == ReduceOp::kMean;
        CAPTURE(size, mean, finish_in_start_order);
        const PerRank inputs = make_inputs(size);
        const PerRank expected = reduce_with_plain_ring(inputs, op);
        PerRank data = inputs;
        std::atomic<bool> rank0_started_all{false};
        std::vector<int> waited(size, 1), ranks(size, -1), sizes(size, -1);
        World world = make_world(size, Wrap::kThreaded);
        run_ranks(world, [&](int rank, Communicator& comm) {
          ranks[rank] = comm.rank();
          sizes[rank] = comm.size();
          // Rank 0 starts every bucket before any other rank starts one: a start that blocked
          // until its all-reduce ran would wait here for the link's time-out.
          if (rank != 0) waited[rank] = wait_for([&] { return rank0_started_all.load(); });
          std::vector<ReduceTicket> tickets;
          for (size_t b = data[rank].size(); b-- > 0;)
            tickets.push_back(
                comm.start_all_reduce(data[rank][b].data(), data[rank][b].size(), op));
          if (rank == 0) rank0_started_all = true;
          if (finish_in_start_order) {
            for (ReduceTicket ticket : tickets) comm.finish_all_reduce(ticket);
          } else {
            for (size_t t = tickets.size(); t-- > 0;) comm.finish_all_reduce(tickets[t]);
          }
        });
        for (int rank = 0; rank < size; ++rank) {
          CHECK(waited[rank] == 1);
          CHECK(ranks[rank] == rank);
          CHECK(sizes[rank] == size);
        }
        check_buckets(data, expected, inputs);
        check_paired(world);
      }
    }
  }
}

TEST_CASE("blocking collectives wait for the started all-reduces, then run") {
  const int size = 3;
  const PerRank inputs = make_inputs(size);
  const PerRank expected = reduce_with_plain_ring(inputs, ReduceOp::kSum);
  PerRank after_broadcast = inputs, data = inputs;
  std::vector<int> roots(size, -1);
  std::vector<std::vector<uint8_t>> gathered(size);
  World world = make_world(size, Wrap::kThreaded);
  run_ranks(world, [&](int rank, Communicator& comm) {
    std::vector<ReduceTicket> tickets;
    for (size_t b = data[rank].size(); b-- > 0;)
      tickets.push_back(
          comm.start_all_reduce(data[rank][b].data(), data[rank][b].size(), ReduceOp::kSum));
    if (rank == 1) roots[rank] = 41;
    comm.broadcast(&roots[rank], sizeof(int), 1);
    after_broadcast[rank] = data[rank];  // already reduced, before any finish
    comm.barrier();
    const uint8_t mine = uint8_t(20 + rank);
    gathered[rank] = comm.all_gather(&mine, 1);
    for (ReduceTicket ticket : tickets) comm.finish_all_reduce(ticket);
  });
  check_buckets(after_broadcast, expected, inputs);
  check_buckets(data, expected, inputs);
  for (int rank = 0; rank < size; ++rank) {
    CHECK(roots[rank] == 41);
    CHECK(gathered[rank] == std::vector<uint8_t>{20, 21, 22});
  }
  check_paired(world);
}

TEST_CASE("the blocking all_reduce runs after the started ones, in the same ring order") {
  const int size = 2;
  const PerRank inputs = make_inputs(size);
  const PerRank expected = reduce_with_plain_ring(inputs, ReduceOp::kMean);
  PerRank data = inputs;
  World world = make_world(size, Wrap::kThreaded);
  run_ranks(world, [&](int rank, Communicator& comm) {
    std::vector<ReduceTicket> tickets;
    for (size_t b = data[rank].size(); b-- > 1;)  // every bucket but the first, started
      tickets.push_back(
          comm.start_all_reduce(data[rank][b].data(), data[rank][b].size(), ReduceOp::kMean));
    comm.all_reduce(data[rank][0].data(), data[rank][0].size(), ReduceOp::kMean);
    for (ReduceTicket ticket : tickets) comm.finish_all_reduce(ticket);
  });
  check_buckets(data, expected, inputs);
  check_paired(world);
}

TEST_CASE("an abort mid-sequence fails the others' finishes with its message, then starts") {
  for (int size : {2, 3}) {
    CAPTURE(size);
    const int failing = size - 1;
    const std::string message = "rank " + std::to_string(failing) + " ran out of memory";
    PerRank data = make_inputs(size);
    std::vector<std::string> second(size), third(size), restart(size), aborter_restart(size);
    std::atomic<int> others_ready{0};
    bool aborter_waited = false;
    // Simulated time that nobody moves: a receive ends on data or the abort, never on its
    // time-out (one that would needs the guard and fails with another message).
    World world = make_world(size, Wrap::kThreaded, std::chrono::seconds(10), LinkTime::kSimulated);
    run_ranks(world, [&](int rank, Communicator& comm) {
      const ReduceTicket first = comm.start_all_reduce(data[rank][2].data(), 1009, ReduceOp::kSum);
      if (rank == failing) {
        comm.finish_all_reduce(first);
        // Not before the others started all three and finished the first: their starts must
        // not meet the failure yet, and the link fails a wait on any neighbour's abort.
        aborter_waited = wait_for([&] { return others_ready == failing; });
        comm.abort(message);
        try {
          comm.start_all_reduce(data[rank][1].data(), 1, ReduceOp::kSum);
        } catch (const IoError& e) {
          aborter_restart[rank] = e.what();
        }
        return;
      }
      const ReduceTicket two = comm.start_all_reduce(data[rank][3].data(), 100000, ReduceOp::kSum);
      const ReduceTicket three = comm.start_all_reduce(data[rank][1].data(), 1, ReduceOp::kSum);
      comm.finish_all_reduce(first);  // the failing rank took part in this one
      ++others_ready;
      second[rank] = error_of(comm, two);
      third[rank] = error_of(comm, three);
      try {
        comm.start_all_reduce(data[rank][4].data(), 7, ReduceOp::kSum);
      } catch (const IoError& e) {
        restart[rank] = e.what();
      }
    });
    CHECK(aborter_waited);
    CHECK_THAT(aborter_restart[failing], Catch::Contains(message));
    for (int rank = 0; rank < failing; ++rank) {
      CAPTURE(rank);
      CHECK_THAT(second[rank], Catch::Contains(message));
      CHECK(third[rank] == second[rank]);
      CHECK(restart[rank] == second[rank]);
    }
    for (int rank = 0; rank < size; ++rank)
      CHECK(world.ring->timeouts_of(rank) == 0);  // the abort travelled; no wait timed out
  }
}

TEST_CASE("an abort with jobs queued or in flight returns, and every peer hears of it") {
  const int size = 3;
  const std::string message = "rank 0 lost its GPU";
  PerRank data = make_inputs(size);
  std::vector<std::string> errors(size);
  World world = make_world(size, Wrap::kThreaded, std::chrono::seconds(10));
  run_ranks(world, [&](int rank, Communicator& comm) {
    try {  // a peer may fail as early as its starts: the abort can beat them
      std::vector<ReduceTicket> tickets;
      for (size_t b = 4; b-- > 1;)
        tickets.push_back(
            comm.start_all_reduce(data[rank][b].data(), data[rank][b].size(), ReduceOp::kSum));
      if (rank == 0) comm.abort(message);  // the first job may be queued, in flight or done
      for (ReduceTicket ticket : tickets) comm.finish_all_reduce(ticket);
      // Every job ran before the abort: the next one fails.
      comm.finish_all_reduce(comm.start_all_reduce(data[rank][4].data(), 7, ReduceOp::kSum));
    } catch (const IoError& e) {
      errors[rank] = e.what();
    }
  });
  for (int rank = 0; rank < size; ++rank) {
    CAPTURE(rank);
    CHECK_THAT(errors[rank], Catch::Contains(message));
  }
}

TEST_CASE("a peer that never starts makes finish throw the link's time-out, once") {
  PerRank data = make_inputs(2);
  const std::chrono::milliseconds timeout(200);
  World world = make_world(2, Wrap::kThreaded, timeout, LinkTime::kSimulated);
  const ReduceTicket one =
      world.comms[0]->start_all_reduce(data[0][2].data(), 1009, ReduceOp::kSum);
  const ReduceTicket two =
      world.comms[0]->start_all_reduce(data[0][3].data(), 100000, ReduceOp::kSum);
  // The first job is in flight: its first send is out and it waits for rank 1, which never
  // comes; the time-out's worth of simulated time ends that wait.
  REQUIRE(wait_for([&] { return world.ring->is_waiting(0); }));
  CHECK(world.links[1]->unread_calls() == 1);
  world.ring->advance(timeout);
  const std::string first_error = error_of(*world.comms[0], one);
  const std::string second_error = error_of(*world.comms[0], two);
  CHECK_THROWS_WITH(world.comms[0]->barrier(), Catch::Contains("timed out"));
  CHECK_THAT(first_error, Catch::Contains("timed out") && Catch::Contains("from rank 1"));
  CHECK(second_error == first_error);
  // Once: the second job and the barrier failed on the first job's time-out, without a wait.
  CHECK(world.ring->timeouts_of(0) == 1);
  CHECK(world.links[1]->unread_calls() == 1);  // one send of the first job; nothing after it
  CHECK_THROWS_AS(world.comms[0]->finish_all_reduce(ReduceTicket{3}), EnforceError);
}

TEST_CASE("destroying a threaded communicator with jobs queued drops them and returns") {
  PerRank data = make_inputs(2);
  const std::chrono::milliseconds timeout(200);
  World world = make_world(2, Wrap::kThreaded, timeout, LinkTime::kSimulated);
  for (size_t b = 1; b < 4; ++b)
    world.comms[0]->start_all_reduce(data[0][b].data(), data[0][b].size(), ReduceOp::kSum);
  // Rank 1 never takes part: once rank 0's first job is in flight (its first send is out and it
  // waits), it can only end by the link's time-out, and the two queued behind it must be dropped.
  const bool in_flight = wait_for([&] { return world.ring->is_waiting(0); });
  std::thread destroyer([&] { world.comms[0].reset(); });
  // The in-flight job's time-out. Whether it comes before the destructor takes the queue or
  // after, the queued jobs are dropped unrun; a queued job that ran would wait again, and only
  // the guard (kSimulatedTimeGuard) would end it.
  world.ring->advance(timeout);
  destroyer.join();
  CHECK(in_flight);
  CHECK(world.ring->timeouts_of(0) == 1);      // the in-flight job's wait, and no other
  CHECK(world.links[1]->unread_calls() == 1);  // the queued jobs never touched the link
}

TEST_CASE("HostStagedCommunicator reduces device buckets like the plain ring") {
  const int size = 2;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
    const bool mean = op == ReduceOp::kMean;
    CAPTURE(mean);
    const PerRank inputs = make_inputs(size);
    const PerRank expected = reduce_with_plain_ring(inputs, op);
    PerRank data(size);
    std::vector<int> roots(size, -1), ranks(size, -1), sizes(size, -1);
    std::vector<std::unique_ptr<dtrain::nn::Device>> devices;
    for (int rank = 0; rank < size; ++rank) devices.push_back(dtrain::nn::make_host_device());
    World world = make_world(size, Wrap::kPlain);
    for (int rank = 0; rank < size; ++rank) {
      world.comms[rank] =
          std::make_unique<HostStagedCommunicator>(std::move(world.comms[rank]), *devices[rank]);
    }
    run_ranks(world, [&](int rank, Communicator& comm) {
      ranks[rank] = comm.rank();
      sizes[rank] = comm.size();
      std::vector<dtrain::nn::Buffer<float>> buckets;
      for (const std::vector<float>& host : inputs[rank]) {
        buckets.emplace_back(*devices[rank], host.size());
        buckets.back().from_host(host);
      }
      std::vector<ReduceTicket> tickets;
      for (size_t b = buckets.size(); b-- > 0;)  // staging grows, then is reused smaller
        tickets.push_back(comm.start_all_reduce(buckets[b].data(), buckets[b].size(), op));
      for (ReduceTicket ticket : tickets) comm.finish_all_reduce(ticket);
      if (rank == 0) roots[rank] = 7;
      comm.broadcast(&roots[rank], sizeof(int), 0);
      for (dtrain::nn::Buffer<float>& bucket : buckets) data[rank].push_back(bucket.to_host());
    });
    check_buckets(data, expected, inputs);
    for (int rank = 0; rank < size; ++rank) {
      CHECK(roots[rank] == 7);
      CHECK(ranks[rank] == rank);
      CHECK(sizes[rank] == size);
    }
    check_paired(world);
  }
}
