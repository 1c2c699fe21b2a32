// Ring collectives over the in-process link, one thread per rank: all-reduce against a float64
// sum and against the documented float32 addition order, bit-identity across ranks, runs and
// slice sizes; broadcast from every root; all-gather; barrier; abort and time-out; and the two
// communicators. Not the TCP link: that has its own tests.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "test/comm/in_process_link.h"
#include "worker/comm/ring_algorithms.h"
#include "worker/comm/ring_communicator.h"

using namespace dtrain::comm;
using dtrain::common::EnforceError;
using dtrain::common::IoError;
using dtrain::testing::InProcessLink;
using dtrain::testing::make_in_process_ring;

namespace {

using Links = std::vector<std::unique_ptr<RingLink>>;
using PerRank = std::vector<std::vector<float>>;

constexpr size_t kNone = SIZE_MAX;
constexpr size_t kLarge = size_t{1} << 20;
const std::vector<size_t> kLengths = {0, 1, 3, 840, 1009, kLarge};

// Runs body(rank) on one thread per rank. A rank that throws calls abort_rank(rank, what) so the
// others fail fast instead of waiting for the time-out; the first error is rethrown here.
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

// run_threads over a ring; afterwards every call's send must have been received, or some rank
// made more calls than its neighbour.
template <typename Body>
void run_ranks(Links& links, Body body) {
  run_threads(
      static_cast<int>(links.size()), [&](int rank) { body(rank, *links[rank]); },
      [&](int rank, const std::string& message) { links[rank]->abort(message); });
  for (size_t rank = 0; rank < links.size(); ++rank) {
    const size_t unread = dynamic_cast<InProcessLink&>(*links[rank]).unread_calls();
    if (unread > 0) throw std::runtime_error(fmt::format("rank {}: {} calls unread", rank, unread));
  }
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Magnitudes 1e-3 .. 2e3 and both signs, so the order of float additions shows in the bits.
float input_value(int rank, size_t index) {
  static constexpr float kScales[] = {1e-3f, 1e-2f, 1e-1f, 1.0f, 1e1f, 1e2f, 1e3f};
  const uint64_t h = mix((static_cast<uint64_t>(rank) << 40) ^ index);
  const float value = (1.0f + static_cast<float>(h >> 40) / 16777216.0f) * kScales[(h >> 8) % 7];
  return (h & 1) ? -value : value;
}

PerRank make_inputs(int size, size_t count) {
  PerRank inputs(static_cast<size_t>(size), std::vector<float>(count));
  for (int rank = 0; rank < size; ++rank)
    for (size_t i = 0; i < count; ++i) inputs[rank][i] = input_value(rank, i);
  return inputs;
}

PerRank all_reduce_on_ring(const PerRank& inputs, ReduceOp op, size_t slice_bytes = kSliceBytes) {
  PerRank data = inputs;
  const int size = static_cast<int>(inputs.size());
  Links links = make_in_process_ring(size);
  run_ranks(links, [&](int rank, RingLink& link) {
    std::vector<float> scratch;
    ring_all_reduce(link, rank, size, data[rank].data(), data[rank].size(), op, scratch,
                    slice_bytes);
  });
  return data;
}

// First index where got is further from the float64 sum than float32 rounding allows.
size_t first_beyond_rounding(const PerRank& inputs, const std::vector<float>& got) {
  const double size = static_cast<double>(inputs.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double sum = 0, magnitude = 0;
    for (const std::vector<float>& x : inputs) sum += x[i], magnitude += std::fabs(x[i]);
    if (std::fabs(got[i] - sum) > size * std::ldexp(magnitude, -23) + 1e-30) return i;
  }
  return kNone;
}

// First index whose bits differ from ((x_c + x_{c+1}) + ...) + x_{c-1} in float, c its chunk.
size_t first_unlike_ring_order(const PerRank& inputs, const std::vector<float>& got) {
  const int size = static_cast<int>(inputs.size());
  for (int chunk = 0; chunk < size; ++chunk) {
    const IndexRange range = ring_chunk(got.size(), size, chunk);
    for (size_t i = range.begin; i < range.end; ++i) {
      float sum = inputs[chunk][i];
      for (int step = 1; step < size; ++step) sum += inputs[(chunk + step) % size][i];
      if (std::memcmp(&sum, &got[i], sizeof(float)) != 0) return i;
    }
  }
  return kNone;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// First rank whose result is not bit-identical to rank 0's, or -1.
int first_rank_unlike_rank0(const PerRank& results) {
  for (size_t rank = 1; rank < results.size(); ++rank)
    if (!same_bits(results[rank], results[0])) return static_cast<int>(rank);
  return -1;
}

}  // namespace

TEST_CASE("ring_chunk splits count into contiguous chunks, larger ones first") {
  for (int size = 1; size <= 8; ++size) {
    for (size_t count : kLengths) {
      CAPTURE(size, count);
      size_t end = 0;
      for (int chunk = 0; chunk < size; ++chunk) {
        const IndexRange range = ring_chunk(count, size, chunk);
        CHECK(range.begin == end);
        CHECK(range.size() == count / size + (static_cast<size_t>(chunk) < count % size ? 1 : 0));
        end = range.end;
      }
      CHECK(end == count);
    }
  }
}

TEST_CASE("ring_all_reduce sums like float64, in the documented order, identically everywhere") {
  for (int size = 1; size <= 8; ++size) {
    for (size_t count : kLengths) {
      CAPTURE(size, count);
      const PerRank inputs = make_inputs(size, count);
      const PerRank results = all_reduce_on_ring(inputs, ReduceOp::kSum);
      CHECK(first_beyond_rounding(inputs, results[0]) == kNone);
      CHECK(first_unlike_ring_order(inputs, results[0]) == kNone);
      CHECK(first_rank_unlike_rank0(results) == -1);
    }
  }
}

TEST_CASE("ring_all_reduce gives the same bits run after run") {
  for (int size : {2, 3, 8}) {
    for (size_t count : {size_t{1009}, kLarge}) {
      CAPTURE(size, count);
      const PerRank inputs = make_inputs(size, count);
      CHECK(same_bits(all_reduce_on_ring(inputs, ReduceOp::kSum)[0],
                      all_reduce_on_ring(inputs, ReduceOp::kSum)[0]));
    }
  }
}

TEST_CASE("kMean is the sum divided by size, bit-identical on every rank") {
  for (int size = 1; size <= 8; ++size) {
    for (size_t count : {size_t{1}, size_t{1009}, size % 3 == 0 ? kLarge : size_t{840}}) {
      CAPTURE(size, count);
      const PerRank inputs = make_inputs(size, count);
      const std::vector<float> sums = all_reduce_on_ring(inputs, ReduceOp::kSum)[0];
      std::vector<float> expected(count);
      for (size_t i = 0; i < count; ++i) expected[i] = sums[i] / static_cast<float>(size);
      const PerRank means = all_reduce_on_ring(inputs, ReduceOp::kMean);
      for (int rank = 0; rank < size; ++rank) CHECK(same_bits(means[rank], expected));
    }
  }
}

TEST_CASE("the slice size does not change the bits") {
  for (int size : {2, 3, 5, 8}) {
    for (size_t count : {size_t{3}, size_t{1009}, size_t{4099}, size_t{1} << 17}) {
      const PerRank inputs = make_inputs(size, count);
      const std::vector<float> reference = all_reduce_on_ring(inputs, ReduceOp::kSum)[0];
      for (size_t slice_bytes : {size_t{4}, size_t{16}, size_t{20}, size_t{4096}}) {
        if (count > 4099 && slice_bytes < 4096) continue;  // a million calls: too slow here
        CAPTURE(size, count, slice_bytes);
        const PerRank sliced = all_reduce_on_ring(inputs, ReduceOp::kSum, slice_bytes);
        CHECK(first_rank_unlike_rank0(sliced) == -1);
        CHECK(same_bits(sliced[0], reference));
      }
    }
  }
}

TEST_CASE("ring collectives reject impossible arguments") {
  Links links = make_in_process_ring(2);
  std::vector<float> scratch, data(4);
  CHECK_THROWS_AS(ring_all_reduce(*links[0], 2, 2, data.data(), 4, ReduceOp::kSum, scratch),
                  EnforceError);
  CHECK_THROWS_AS(ring_all_reduce(*links[0], 0, 2, data.data(), 4, ReduceOp::kSum, scratch, 3),
                  EnforceError);
  CHECK_THROWS_AS(ring_broadcast(*links[0], 0, 2, data.data(), 16, 2), EnforceError);
  CHECK_THROWS_AS(ring_all_gather(*links[0], -1, 2, data.data(), 16), EnforceError);
}

TEST_CASE("ring_broadcast copies root's bytes to every rank, from every root") {
  for (int size = 1; size <= 5; ++size) {
    for (int root = 0; root < size; ++root) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{37}, size_t{1000003}}) {
        for (size_t slice_bytes : {kSliceBytes, size_t{1000}, size_t{16}}) {
          if (bytes > 1000 && slice_bytes < 1000) continue;  // too many calls for a unit test
          CAPTURE(size, root, bytes, slice_bytes);
          std::vector<uint8_t> expected(bytes);  // never 0xA5 at index 0, different per root
          for (size_t i = 0; i < bytes; ++i) expected[i] = uint8_t(i * 31 + root * 7 + 1);
          std::vector<std::vector<uint8_t>> data(size, std::vector<uint8_t>(bytes, 0xA5));
          data[root] = expected;
          Links links = make_in_process_ring(size);
          run_ranks(links, [&](int rank, RingLink& link) {
            ring_broadcast(link, rank, size, data[rank].data(), bytes, root, slice_bytes);
          });
          for (int rank = 0; rank < size; ++rank) CHECK(data[rank] == expected);
        }
      }
    }
  }
}

TEST_CASE("ring_all_gather returns every rank's bytes in rank order") {
  for (int size = 1; size <= 8; ++size) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{300007}}) {
      for (size_t slice_bytes : {kSliceBytes, size_t{1000}}) {
        CAPTURE(size, bytes, slice_bytes);
        auto block = [&](int rank) {
          std::vector<uint8_t> mine(bytes);
          for (size_t i = 0; i < bytes; ++i) mine[i] = uint8_t(rank * 37 + i * 11 + 1);
          return mine;
        };
        std::vector<uint8_t> expected;
        for (int rank = 0; rank < size; ++rank) {
          const std::vector<uint8_t> mine = block(rank);
          expected.insert(expected.end(), mine.begin(), mine.end());
        }
        std::vector<std::vector<uint8_t>> results(size);
        Links links = make_in_process_ring(size);
        run_ranks(links, [&](int rank, RingLink& link) {
          results[rank] = ring_all_gather(link, rank, size, block(rank).data(), bytes, slice_bytes);
        });
        for (int rank = 0; rank < size; ++rank) CHECK(results[rank] == expected);
      }
    }
  }
}

TEST_CASE("ring_barrier returns only after every rank has arrived") {
  for (int size = 1; size <= 8; ++size) {
    CAPTURE(size);
    std::vector<std::atomic<bool>> arrived(size);
    std::atomic<int> left_early{0};
    Links links = make_in_process_ring(size);
    run_ranks(links, [&](int rank, RingLink& link) {
      if (rank == size - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      arrived[rank] = true;
      ring_barrier(link, rank, size);
      for (const std::atomic<bool>& other : arrived)
        if (!other) ++left_early;
    });
    CHECK(left_early == 0);
  }
}

TEST_CASE("an abort from one rank makes every other rank's collective throw its message") {
  for (int size = 2; size <= 5; ++size) {
    for (int failing = 0; failing < size; ++failing) {
      CAPTURE(size, failing);
      const std::string message = "rank " + std::to_string(failing) + " ran out of memory";
      Links links = make_in_process_ring(size, std::chrono::seconds(5));
      PerRank data = make_inputs(size, 1009);
      std::vector<std::string> errors(size);
      auto body = [&](int rank) {  // not run_ranks: the abort leaves calls unread
        std::vector<float> scratch;
        auto all_reduce = [&] {
          ring_all_reduce(*links[rank], rank, size, data[rank].data(), 1009, ReduceOp::kSum,
                          scratch);
        };
        if (rank == failing) {
          all_reduce();
          return links[rank]->abort(message);
        }
        try {  // the others may be in either all-reduce when the abort comes
          all_reduce();
          all_reduce();
        } catch (const IoError& e) {
          errors[rank] = e.what();
        }
      };
      run_threads(size, body, [&](int rank, const std::string& what) { links[rank]->abort(what); });
      for (int rank = 0; rank < size; ++rank)
        if (rank != failing) CHECK_THAT(errors[rank], Catch::Contains(message));
    }
  }
}

TEST_CASE("the in-process link times out naming the rank it waited for") {
  Links links = make_in_process_ring(3, std::chrono::milliseconds(50));
  float value = 0;
  CHECK_THROWS_AS(links[1]->send_recv(nullptr, 0, &value, sizeof(value)), IoError);
  CHECK_THROWS_WITH(links[1]->send_recv(nullptr, 0, &value, sizeof(value)),
                    Catch::Contains("timed out") && Catch::Contains("4 bytes from rank 0"));
}

TEST_CASE("RingCommunicator runs the ring collectives over its link") {
  const int size = 4;
  Links links = make_in_process_ring(size, std::chrono::seconds(5));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int rank = 0; rank < size; ++rank)
    comms.push_back(std::make_unique<RingCommunicator>(std::move(links[rank]), rank, size));
  const PerRank inputs = make_inputs(size, 1009);
  PerRank data = inputs;
  std::vector<int> roots(size, -1);
  std::vector<std::vector<uint8_t>> gathered(size);
  std::vector<std::string> errors(size);
  run_threads(
      size,
      [&](int rank) {
        Communicator& comm = *comms[rank];
        comm.all_reduce(data[rank].data(), 1009, ReduceOp::kMean);
        if (rank == 2) roots[rank] = 2;
        comm.broadcast(&roots[rank], sizeof(int), 2);
        const uint8_t mine = uint8_t(10 + comm.rank());
        gathered[rank] = comm.all_gather(&mine, 1);
        if (rank == 3) {
          comm.barrier();
          return comm.abort("rank 3 lost its GPU");
        }
        try {  // the others may still be in the first barrier when the abort comes
          comm.barrier();
          comm.barrier();
        } catch (const IoError& e) {
          errors[rank] = e.what();
        }
      },
      [&](int rank, const std::string& message) { comms[rank]->abort(message); });
  const std::vector<float> means = all_reduce_on_ring(inputs, ReduceOp::kMean)[0];
  for (int rank = 0; rank < size; ++rank) {
    CAPTURE(rank);
    CHECK(comms[rank]->rank() == rank);
    CHECK(comms[rank]->size() == size);
    CHECK(same_bits(data[rank], means));
    CHECK(roots[rank] == 2);
    CHECK(gathered[rank] == std::vector<uint8_t>{10, 11, 12, 13});
    if (rank != 3) CHECK_THAT(errors[rank], Catch::Contains("rank 3 lost its GPU"));
  }
}

TEST_CASE("SoloCommunicator is rank 0 of 1 and leaves data as it is") {
  SoloCommunicator comm;
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  const std::vector<float> inputs = make_inputs(1, 1009)[0];
  std::vector<float> data = inputs;
  comm.all_reduce(data.data(), data.size(), ReduceOp::kSum);
  comm.all_reduce(data.data(), data.size(), ReduceOp::kMean);
  CHECK(same_bits(data, inputs));
  uint8_t bytes[3] = {1, 2, 3};
  comm.broadcast(bytes, sizeof(bytes), 0);
  CHECK(bytes[2] == 3);
  CHECK_THROWS_AS(comm.broadcast(bytes, sizeof(bytes), 1), EnforceError);
  CHECK(comm.all_gather(bytes, sizeof(bytes)) == std::vector<uint8_t>{1, 2, 3});
  CHECK(comm.all_gather(nullptr, 0).empty());
  comm.barrier();
  comm.abort("nothing to tell");
}
