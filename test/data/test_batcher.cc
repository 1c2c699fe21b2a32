// Data order and batching: the PRNG's reference values, epoch_order as a pure permutation of
// (seed, epoch), DATA sharding, and BatchStream (threaded next() against pure batch_at(),
// wrap-around, resume, CHW conversion, bytes to floats, the thread's scheduling policy, clean stop
// mid-epoch). Datasets are built by hand with label == example index, so a batch's labels say
// which examples it holds.
#include <sched.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "worker/data/batcher.h"

using namespace dtrain::data;
using dtrain::common::ConfigError;
using dtrain::common::EnforceError;

namespace {

// count examples of h x w x c; label i == i; pixel p of example i == i + p / 1000.
Dataset indexed(int64_t count, int h, int w, int c) {
  Dataset data{count, h, w, c, static_cast<int>(count), {}, {}, {}, {}, {}, {}, 0};
  const int64_t pixels = int64_t{h} * w * c;
  for (int64_t i = 0; i < count; ++i) {
    data.labels.push_back(static_cast<int32_t>(i));
    for (int64_t p = 0; p < pixels; ++p)
      data.images.push_back(static_cast<float>(i) + static_cast<float>(p) / 1000.0f);
  }
  return data;
}

std::vector<int64_t> iota(int64_t count) {
  std::vector<int64_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

BatchStreamOptions options(int index, int workers, int batch, int64_t steps) {
  BatchStreamOptions o;
  o.seed = 42;
  o.epoch = 1;
  o.worker_index = index;
  o.worker_count = workers;
  o.batch_size = batch;
  o.steps = steps;
  return o;
}

}  // namespace

TEST_CASE("SplitMix64 gives the reference values", "[batcher]") {
  SplitMix64 rng(0);
  CHECK(rng.next() == 0xe220a8397b1dcdafull);
  CHECK(rng.next() == 0x6e789e6aa1b965f4ull);
  CHECK(rng.next() == 0x06c45d188009454full);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 30000; ++i) ++counts[rng.below(3)];
  for (int n : counts) CHECK((n > 9500 && n < 10500));
  CHECK(derive_seed(1, 0) != derive_seed(1, 1));
  CHECK(derive_seed(1, 0) != derive_seed(2, 0));
}

TEST_CASE("epoch_order is a permutation fixed by seed and epoch", "[batcher]") {
  for (int64_t count : {0, 1, 2, 1000}) {
    CHECK(sorted(epoch_order(count, 42, 0)) == iota(count));
  }
  const std::vector<int64_t> order = epoch_order(1000, 42, 3);
  CHECK(order == epoch_order(1000, 42, 3));
  CHECK(order != iota(1000));
  CHECK(order != epoch_order(1000, 43, 3));
  CHECK(order != epoch_order(1000, 42, 4));
  // Pinned: a change here changes every run's data order (and breaks resuming old runs).
  CHECK(epoch_order(8, 7, 0) == std::vector<int64_t>{7, 4, 3, 2, 5, 1, 6, 0});
}

TEST_CASE("shards are disjoint and cover the epoch", "[batcher]") {
  const std::vector<int64_t> order = epoch_order(100, 5, 0);
  for (int workers : {1, 2, 3, 7}) {
    std::vector<int64_t> all;
    for (int i = 0; i < workers; ++i) {
      std::vector<int64_t> mine = shard(order, i, workers);
      CHECK(static_cast<int64_t>(mine.size()) == shard_size(100, i, workers));
      for (size_t k = 0; k < mine.size(); ++k) REQUIRE(mine[k] == order[i + k * workers]);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    CHECK(sorted(all) == iota(100));  // every example exactly once
  }
  CHECK(shard_size(10, 0, 3) == 4);
  CHECK(shard_size(10, 2, 3) == 3);
  CHECK(default_steps(10, 5) == 2);
  CHECK(default_steps(11, 5) == 3);
  CHECK(default_steps(1, 64) == 1);
}

TEST_CASE("BatchStream's threaded batches equal batch_at", "[batcher]") {
  const Dataset data = indexed(100, 2, 2, 1);
  const int64_t steps = 2 * default_steps(shard_size(100, 0, 3), 7);  // two passes: wraps
  BatchStream stream(data, options(1, 3, 7, steps));
  const std::vector<int64_t> mine = shard(epoch_order(100, 42, 1), 1, 3);
  REQUIRE(stream.shard_size() == 33);
  for (int64_t step = 0; step < steps; ++step) {
    Batch batch = stream.next();
    Batch pure = stream.batch_at(step);
    REQUIRE(batch.size == 7);
    REQUIRE(batch.labels == pure.labels);
    REQUIRE(batch.images == pure.images);
    for (int j = 0; j < 7; ++j) REQUIRE(batch.labels[j] == mine[(step * 7 + j) % 33]);
  }
  CHECK_THROWS_AS(stream.next(), EnforceError);
}

TEST_CASE("BatchStream wraps around the shard and resumes mid-epoch", "[batcher]") {
  const Dataset data = indexed(10, 1, 1, 1);
  const std::vector<int64_t> order = epoch_order(10, 42, 1);
  BatchStream stream(data, options(0, 1, 4, 3));
  CHECK(stream.batch_at(2).labels == std::vector<int32_t>{int32_t(order[8]), int32_t(order[9]),
                                                          int32_t(order[0]), int32_t(order[1])});

  BatchStreamOptions resume = options(0, 1, 4, 3);
  resume.first_step = 2;
  BatchStream resumed(data, resume);
  CHECK(resumed.next().labels == stream.batch_at(2).labels);
}

TEST_CASE("BatchStream converts HWC to CHW", "[batcher]") {
  const Dataset data = indexed(5, 2, 3, 3);
  BatchStream stream(data, options(0, 1, 2, 1));
  const Batch batch = stream.next();
  for (int j = 0; j < 2; ++j) {
    const int64_t example = batch.labels[j];
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 2; ++y)
        for (int x = 0; x < 3; ++x) {
          const float chw = batch.images[j * 18 + c * 6 + y * 3 + x];
          REQUIRE(chw == data.images[example * 18 + (y * 3 + x) * 3 + c]);
        }
  }
  // One channel: the same bytes as HWC.
  const Dataset gray = indexed(5, 2, 3, 1);
  const Batch plain = BatchStream(gray, options(0, 1, 1, 1)).batch_at(0);
  CHECK(std::equal(plain.images.begin(), plain.images.end(),
                   gray.images.begin() + plain.labels[0] * 6));
}

TEST_CASE("pixel bytes become v / 255 exactly, every value, in one and three channels",
          "[batcher]") {
  for (int channels : {1, 3}) {
    Dataset data = indexed(1, 16, 16, channels);  // its float pixels are replaced by bytes
    data.images.clear();
    for (int i = 0; i < 256 * channels; ++i)
      data.bytes.push_back(static_cast<uint8_t>((i * 7 + channels) % 256));
    std::vector<float> chw(static_cast<size_t>(256) * channels);
    copy_example_chw(data, 0, chw.data());
    for (int c = 0; c < channels; ++c)
      for (int pixel = 0; pixel < 256; ++pixel)
        REQUIRE(chw[c * 256 + pixel] ==
                static_cast<float>(data.bytes[pixel * channels + c]) / 255.0f);
  }
}

// The producer must not take the consumer's core when a pop wakes it (batcher.cc).
TEST_CASE("BatchStream's thread runs as SCHED_BATCH", "[batcher]") {
  const Dataset data = indexed(100, 2, 2, 1);
  BatchStream stream(data, options(0, 1, 4, 20));
  stream.next();  // the thread has started, and set its policy first
  int found = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "dt-batches") continue;
    ++found;
    CHECK(sched_getscheduler(static_cast<pid_t>(std::stol(task.path().filename().string()))) ==
          SCHED_BATCH);
  }
  CHECK(found == 1);
}

TEST_CASE("BatchStream stops cleanly when dropped mid-epoch", "[batcher]") {
  const Dataset data = indexed(1000, 4, 4, 1);
  const auto start = std::chrono::steady_clock::now();
  { BatchStream untouched(data, options(0, 2, 8, 1000)); }
  {
    BatchStream stream(data, options(1, 2, 8, 1000));
    stream.next();
    stream.next();
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
}

TEST_CASE("BatchStream refuses more workers than examples", "[batcher]") {
  const Dataset data = indexed(3, 1, 1, 1);
  CHECK_THROWS_AS(BatchStream(data, options(0, 4, 1, 1)), ConfigError);
  CHECK_THROWS_WITH(BatchStream(data, options(0, 4, 1, 1)),
                    Catch::Contains("3 examples cannot be sharded among 4 workers"));
  CHECK_THROWS_AS(BatchStream(data, options(4, 4, 1, 1)), EnforceError);
}
