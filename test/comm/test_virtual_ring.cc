// The elastic all-reduce (docs/design.md#elastic-membership): virtual_ring_all_reduce over the
// in-process link, one thread per real rank, for every contiguous split of a virtual ring into
// real ranks (rotated ones included), against ring_all_reduce over as many real ranks as virtual
// ones, bit for bit; then through RingCommunicator, ThreadedCommunicator, GroupCommunicator and
// SoloCommunicator, and the default that refuses shards. Not the TCP link: that has its own tests.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "common/progress_record.h"
#include "test/comm/in_process_link.h"
#include "test/support/temp_dir.h"
#include "worker/comm/group_communicator.h"
#include "worker/comm/ring_algorithms.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/threaded_communicator.h"

using namespace dtrain::comm;
using dtrain::common::EnforceError;
using dtrain::common::ProgressRecordWriter;
using dtrain::common::read_progress_record;
using dtrain::testing::InProcessLink;
using dtrain::testing::make_in_process_ring;

namespace {

using Links = std::vector<std::unique_ptr<RingLink>>;
using PerRank = std::vector<std::vector<float>>;  // indexed by virtual rank

/// Real rank r holds blocks[r] virtual ranks from start + blocks[0] + ... + blocks[r-1].
struct Membership {
  std::vector<int> blocks;
  int start = 0;

  int first(int rank, int virtual_size) const {
    int at = start;
    for (int r = 0; r < rank; ++r) at += blocks[static_cast<size_t>(r)];
    return at % virtual_size;
  }
};

// Every split of virtual_size into contiguous non-empty blocks, each from every start.
std::vector<Membership> every_membership(int virtual_size) {
  std::vector<Membership> all;
  for (unsigned cuts = 0; cuts < (1u << (virtual_size - 1)); ++cuts) {
    std::vector<int> blocks{1};
    for (int v = 1; v < virtual_size; ++v) {
      if (cuts & (1u << (v - 1))) blocks.push_back(0);
      ++blocks.back();
    }
    for (int start = 0; start < virtual_size; ++start) all.push_back({blocks, start});
  }
  return all;
}

// Runs body(rank) on one thread per rank; a rank that throws calls abort_rank(rank, what) so the
// others fail fast. The first error is rethrown here.
template <typename Body, typename Abort>
void run_threads(int size, Body body, Abort abort_rank) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
        abort_rank(rank, e.what());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

// run_threads over links, one thread per link.
template <typename Body>
void run_ranks(Links& links, Body body) {
  run_threads(static_cast<int>(links.size()), body,
              [&](int rank, const std::string& what) { links[rank]->abort(what); });
}

// Every call's send was received: no real rank made more calls than its neighbour.
void check_paired(const Links& links) {
  for (size_t rank = 0; rank < links.size(); ++rank) {
    const size_t unread = dynamic_cast<const InProcessLink&>(*links[rank]).unread_calls();
    if (unread > 0) throw std::runtime_error(fmt::format("rank {}: {} calls unread", rank, unread));
  }
}

// Magnitudes 1e-3 .. 1e3 and both signs, so the order of float additions shows in the bits.
PerRank make_inputs(int virtual_size, size_t count) {
  std::mt19937 engine(20261126u + static_cast<unsigned>(virtual_size * 7919 + count));
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-3, 3);
  PerRank inputs(static_cast<size_t>(virtual_size), std::vector<float>(count));
  for (std::vector<float>& x : inputs)
    for (float& value : x)
      value = mantissa(engine) * std::pow(10.0f, exponent(engine)) * (engine() & 1 ? -1 : 1);
  return inputs;
}

// The oracle: ring_all_reduce over virtual_size real ranks.
PerRank reduce_on_full_ring(const PerRank& inputs, ReduceOp op, size_t slice_bytes) {
  PerRank data = inputs;
  const int size = static_cast<int>(inputs.size());
  Links links = make_in_process_ring(size);
  run_ranks(links, [&](int rank) {
    std::vector<float> scratch;
    ring_all_reduce(*links[rank], rank, size, data[rank].data(), data[rank].size(), op, scratch,
                    slice_bytes);
  });
  check_paired(links);
  return data;
}

// Each real rank's buffers: pointers into data, one per virtual rank it holds.
std::vector<float*> held_buffers(PerRank& data, int first, int held) {
  std::vector<float*> buffers;
  for (int j = 0; j < held; ++j) buffers.push_back(data[(first + j) % data.size()].data());
  return buffers;
}

// virtual_ring_all_reduce with one thread per real rank of membership (no link for a world of
// one).
PerRank reduce_elastic(const PerRank& inputs, const Membership& membership, ReduceOp op,
                       size_t slice_bytes) {
  PerRank data = inputs;
  const int virtual_size = static_cast<int>(inputs.size());
  const int size = static_cast<int>(membership.blocks.size());
  Links links = size > 1 ? make_in_process_ring(size) : Links{};
  auto body = [&](int rank) {
    const int first = membership.first(rank, virtual_size);
    const int held = membership.blocks[static_cast<size_t>(rank)];
    std::vector<float*> buffers = held_buffers(data, first, held);
    std::vector<float> scratch;
    virtual_ring_all_reduce(size > 1 ? links[rank].get() : nullptr, rank, size, virtual_size, first,
                            buffers.data(), held, data[0].size(), op, scratch, slice_bytes);
  };
  if (size == 1) {
    body(0);
  } else {
    run_ranks(links, body);
  }
  check_paired(links);
  return data;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// First virtual rank whose buffer is not the oracle's, bit for bit, or -1.
int first_unlike(const PerRank& got, const PerRank& expected) {
  for (size_t v = 0; v < got.size(); ++v)
    if (!same_bits(got[v], expected[v])) return static_cast<int>(v);
  return -1;
}

std::string describe(const Membership& membership) {
  return fmt::format("blocks {} from {}", fmt::join(membership.blocks, "+"), membership.start);
}

}  // namespace

TEST_CASE("virtual_ring_all_reduce equals the full ring's bits, however the ranks are held") {
  struct Shape {
    size_t count;
    size_t slice_bytes;
  };
  for (int virtual_size : {1, 2, 3, 4, 5, 7}) {
    const std::vector<Shape> shapes = {
        {0, kSliceBytes},  {1, kSliceBytes},    {size_t(virtual_size - 1), kSliceBytes},
        {17, kSliceBytes}, {1000, kSliceBytes}, {203, 64}};  // 16 floats a slice: several per chunk
    for (const Shape& shape : shapes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        const PerRank inputs = make_inputs(virtual_size, shape.count);
        const PerRank expected = reduce_on_full_ring(inputs, op, shape.slice_bytes);
        for (const Membership& membership : every_membership(virtual_size)) {
          CAPTURE(virtual_size, shape.count, shape.slice_bytes, op == ReduceOp::kMean,
                  describe(membership));
          const PerRank got = reduce_elastic(inputs, membership, op, shape.slice_bytes);
          REQUIRE(first_unlike(got, expected) == -1);
        }
      }
    }
  }
}

TEST_CASE("the full ring's bits are not those of a rank-order sum, so the test above can fail") {
  for (int virtual_size : {3, 4, 5, 7}) {
    CAPTURE(virtual_size);
    const PerRank inputs = make_inputs(virtual_size, 1000);
    const PerRank expected = reduce_on_full_ring(inputs, ReduceOp::kSum, kSliceBytes);
    std::vector<float> naive(1000);
    for (size_t i = 0; i < naive.size(); ++i)
      for (const std::vector<float>& x : inputs) naive[i] += x[i];
    CHECK_FALSE(same_bits(naive, expected[0]));
  }
}

TEST_CASE("virtual_ring_all_reduce rejects impossible memberships") {
  Links links = make_in_process_ring(2);
  PerRank data(4, std::vector<float>(8));
  std::vector<float*> buffers = held_buffers(data, 0, 4);
  std::vector<float> scratch;
  auto call = [&](RingLink* link, int rank, int size, int virtual_size, int first, int held) {
    virtual_ring_all_reduce(link, rank, size, virtual_size, first, buffers.data(), held, 8,
                            ReduceOp::kSum, scratch);
  };
  CHECK_THROWS_AS(call(links[0].get(), 0, 2, 4, 0, 0), EnforceError);   // holds nothing
  CHECK_THROWS_AS(call(links[0].get(), 0, 2, 4, 0, 4), EnforceError);   // leaves rank 1 none
  CHECK_THROWS_AS(call(links[0].get(), 0, 2, 4, 4, 1), EnforceError);   // first outside
  CHECK_THROWS_AS(call(links[0].get(), 0, 2, 4, -1, 1), EnforceError);  // first outside
  CHECK_THROWS_AS(call(links[0].get(), 0, 2, 1, 0, 1), EnforceError);   // more real than virtual
  CHECK_THROWS_AS(call(nullptr, 0, 2, 4, 0, 2), EnforceError);          // no link
  CHECK_THROWS_AS(call(nullptr, 0, 1, 4, 0, 3), EnforceError);          // a world of one, not all
  CHECK_THROWS_AS(call(links[0].get(), 2, 2, 4, 0, 2), EnforceError);   // rank outside
  buffers[1] = buffers[0];
  CHECK_THROWS_AS(call(nullptr, 0, 1, 4, 0, 4), EnforceError);  // two virtual ranks, one buffer
  buffers[1] = nullptr;
  CHECK_THROWS_AS(call(nullptr, 0, 1, 4, 0, 4), EnforceError);
  CHECK_THROWS_AS(
      virtual_ring_all_reduce(nullptr, 0, 1, 4, 0, nullptr, 4, 8, ReduceOp::kSum, scratch),
      EnforceError);
}

namespace {

enum class Stack { kRing, kGroupOverThreaded };

// size ring communicators over in-process links: plain, or as the trainer sees them (a
// GroupCommunicator over a ThreadedCommunicator), counting collectives in records[rank].
std::vector<std::unique_ptr<Communicator>> make_comms(
    int size, Stack stack, std::vector<std::unique_ptr<ProgressRecordWriter>>& records) {
  Links links = make_in_process_ring(size, std::chrono::seconds(5));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int rank = 0; rank < size; ++rank) {
    std::unique_ptr<Communicator> ring =
        std::make_unique<RingCommunicator>(std::move(links[rank]), rank, size);
    if (stack == Stack::kRing) {
      comms.push_back(std::move(ring));
      continue;
    }
    auto made = std::make_shared<std::unique_ptr<Communicator>>(
        std::make_unique<ThreadedCommunicator>(std::move(ring)));
    comms.push_back(std::make_unique<GroupCommunicator>([made](int) { return std::move(*made); }, 0,
                                                        records[static_cast<size_t>(rank)].get()));
  }
  return comms;
}

}  // namespace

TEST_CASE("ring communicators holding 3+1 or 2+2 of 4 virtual ranks reduce like 4 real ones") {
  const int virtual_size = 4;
  const size_t count = 1009;
  for (Stack stack : {Stack::kRing, Stack::kGroupOverThreaded}) {
    for (const Membership& membership : {Membership{{3, 1}, 0}, Membership{{2, 2}, 3}}) {
      CAPTURE(stack == Stack::kRing, describe(membership));
      dtrain::testing::TempDir dir;
      std::vector<std::unique_ptr<ProgressRecordWriter>> records;
      for (int rank = 0; rank < 2; ++rank)
        records.push_back(std::make_unique<ProgressRecordWriter>(
            fmt::format("{}/progress-{}", dir.path(), rank)));
      std::vector<std::unique_ptr<Communicator>> comms = make_comms(2, stack, records);
      const PerRank inputs = make_inputs(virtual_size, count);
      PerRank data = inputs;
      PerRank started(2, std::vector<float>(64, 1.0f));  // in flight when the shards come
      auto body = [&](int rank) {
        Communicator& comm = *comms[static_cast<size_t>(rank)];
        const ReduceTicket ticket = comm.start_all_reduce(started[rank].data(), 64, ReduceOp::kSum);
        const int first = membership.first(rank, virtual_size);
        const int held = membership.blocks[static_cast<size_t>(rank)];
        std::vector<float*> buffers = held_buffers(data, first, held);
        comm.all_reduce_shards(virtual_size, first, buffers.data(), held, count, ReduceOp::kMean);
        comm.finish_all_reduce(ticket);
      };
      run_threads(2, body, [&](int rank, const std::string& what) { comms[rank]->abort(what); });
      CHECK(first_unlike(data, reduce_on_full_ring(inputs, ReduceOp::kMean, kSliceBytes)) == -1);
      for (const std::vector<float>& sums : started) CHECK(sums == std::vector<float>(64, 2.0f));
      if (stack == Stack::kRing) continue;
      for (int rank = 0; rank < 2; ++rank) {  // start, shards, finish: three collectives
        const auto sample = read_progress_record(fmt::format("{}/progress-{}", dir.path(), rank));
        REQUIRE(sample.has_value());
        CHECK(sample->begun == 3);
        CHECK(sample->ended == 3);
      }
    }
  }
}

TEST_CASE("SoloCommunicator holding every virtual rank sums them like the full ring") {
  SoloCommunicator comm;
  for (int first : {0, 1, 2}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      CAPTURE(first, op == ReduceOp::kMean);
      const PerRank inputs = make_inputs(3, 1000);
      PerRank data = inputs;
      std::vector<float*> buffers = held_buffers(data, first, 3);
      comm.all_reduce_shards(3, first, buffers.data(), 3, 1000, op);
      CHECK(first_unlike(data, reduce_on_full_ring(inputs, op, kSliceBytes)) == -1);
    }
  }
  std::vector<float> one = make_inputs(1, 17)[0], kept = one;  // full membership: no change
  float* buffer = one.data();
  comm.all_reduce_shards(1, 0, &buffer, 1, one.size(), ReduceOp::kMean);
  CHECK(same_bits(one, kept));
  CHECK_THROWS_AS(comm.all_reduce_shards(3, 0, &buffer, 1, one.size(), ReduceOp::kSum),
                  EnforceError);
}

namespace {

// A transport without shards: only the pure virtuals, counting its all-reduces.
class ShardlessCommunicator final : public Communicator {
 public:
  int rank() const override { return 1; }
  int size() const override { return 2; }
  void all_reduce(float* /*data*/, size_t count, ReduceOp /*op*/) override { reduced += count; }
  void broadcast(void* /*data*/, size_t /*bytes*/, int /*root*/) override {}
  void barrier() override {}
  std::vector<uint8_t> all_gather(const void* /*mine*/, size_t /*bytes*/) override { return {}; }
  void abort(const std::string& /*message*/) noexcept override {}
  void interrupt(const std::string& /*why*/) noexcept override {}

  size_t reduced = 0;
};

}  // namespace

TEST_CASE("a transport without shards all-reduces full membership and refuses the rest") {
  ShardlessCommunicator comm;
  std::vector<float> a(5), b(5);
  float* buffers[] = {a.data(), b.data()};
  comm.all_reduce_shards(2, 1, buffers, 1, 5, ReduceOp::kSum);
  CHECK(comm.reduced == 5);
  CHECK_THROWS_AS(comm.all_reduce_shards(2, 0, buffers, 1, 5, ReduceOp::kSum), EnforceError);
  CHECK_THROWS_AS(comm.all_reduce_shards(3, 1, buffers, 1, 5, ReduceOp::kSum), EnforceError);
  CHECK_THROWS_AS(comm.all_reduce_shards(3, 1, buffers, 2, 5, ReduceOp::kSum), EnforceError);
  CHECK(comm.reduced == 5);
}
