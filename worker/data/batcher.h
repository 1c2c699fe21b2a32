// Data order and batching. The order of an epoch depends only on (seed, epoch): a Fisher-Yates
// shuffle driven by splitmix64, never a std:: distribution (those differ between standard
// libraries). Workers shard the shuffled order like tf.data's AutoShardPolicy.DATA, and
// BatchStream prefetches batches on one background thread. No augmentation, no GPU copies.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/data/dataset.h"

namespace dtrain::data {

/// splitmix64 (Steele, Lea, Flood 2014): small, fast, the same numbers on every platform.
/// Not thread-safe; copy it to fork a stream.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  /// Uniform in [0, bound), unbiased (rejection), bound > 0.
  uint64_t below(uint64_t bound);
  /// Uniform in [0, 1) with 24 bits.
  float unit_float();

 private:
  uint64_t state_;
};

/// Seed of sub-stream `stream` of seed: well mixed, distinct for distinct streams. Used to give
/// each epoch, each synthetic example, etc. its own generator.
uint64_t derive_seed(uint64_t seed, uint64_t stream);

/// The permutation of [0, count) for this epoch; a pure function of its arguments.
std::vector<int64_t> epoch_order(int64_t count, uint64_t seed, int epoch);

/// Worker index's share of order (AutoShardPolicy.DATA): elements index, index + workers, ...
std::vector<int64_t> shard(const std::vector<int64_t>& order, int index, int workers);

/// Size of worker index's shard of count elements: count / workers, plus one for the first
/// count % workers workers.
int64_t shard_size(int64_t count, int index, int workers);

/// Steps for one pass over a shard: ceil(shard_size / batch). Keras makes one pass with a
/// partial last batch; we keep every batch full by wrapping around the shard instead, so the
/// last step repeats a few elements from the start. Shards can differ by one element, and every
/// worker must run the same number of steps (they all-reduce each step): pass the largest
/// shard, shard_size(count, 0, workers).
int64_t default_steps(int64_t shard_size, int batch);

/// The first token of a text split's training window (text_data.h) for example `example` of the
/// step's global batch (worker index x batch + j, the worker a virtual shard under elastic
/// membership): uniform over every window that fits, a pure function of its arguments, so a
/// resume, a recovery in place and any membership draw the same windows.
int64_t window_offset(const Dataset& data, uint64_t seed, int epoch, int64_t step, int64_t example);

/// One batch: images in NCHW (for one channel the same bytes as NHWC), labels in [0, classes);
/// a text split's: each window's token ids as floats, and its positions' labels (T per example).
struct Batch {
  int64_t size = 0;
  std::vector<float> images;
  std::vector<int32_t> labels;
};

struct BatchStreamOptions {
  uint64_t seed = 0;
  int epoch = 0;
  int worker_index = 0;
  int worker_count = 1;
  int batch_size = 32;
  int64_t first_step = 0;  ///< resume mid-epoch: the first batch next() returns
  int64_t steps = 1;       ///< next() yields steps first_step .. steps-1
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  ///< longest wait in next()
};

/// Batches of one worker for one epoch. Step s holds shard[(s * batch + j) % shard_size] for
/// j in [0, batch) of that epoch's order, so a batch is a pure function of (seed, epoch, worker,
/// step). A producer thread started in the constructor keeps up to kPrefetchDepth batches
/// ready. The dataset is borrowed and must outlive the stream. next() is for one consumer
/// thread; batch_at() is const and may be called from any thread.
class BatchStream {
 public:
  static constexpr size_t kPrefetchDepth = 3;

  /// Throws ConfigError when the dataset has fewer examples than there are workers.
  BatchStream(const Dataset& dataset, const BatchStreamOptions& options);
  /// Stops the producer and joins it; never throws, also when batches were left unread.
  ~BatchStream();
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;

  /// The next batch, in step order. Blocks until the producer has it; after options.timeout
  /// throws common::IoError naming the step. Rethrows an error from the producer. Calling it
  /// after the last step is an EnforceError.
  Batch next();
  /// Step step's batch, computed here without the thread.
  Batch batch_at(int64_t step) const;
  /// The dataset indices of step step's examples, in batch order (the ledger's record); a text
  /// split's window offsets.
  std::vector<int64_t> ids_at(int64_t step) const;

  int64_t shard_size() const { return static_cast<int64_t>(shard_.size()); }
  int64_t steps() const { return options_.steps; }

 private:
  void produce() noexcept;

  const Dataset& dataset_;
  const BatchStreamOptions options_;
  const std::vector<int64_t> shard_;
  int64_t next_step_;  ///< consumer side: the step next() returns

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;     ///< guarded by mutex_
  bool stopping_ = false;       ///< guarded by mutex_
  std::exception_ptr failure_;  ///< guarded by mutex_
  std::thread producer_;        ///< started last, joined in the destructor
};

}  // namespace dtrain::data
