// See batcher.h. The producer thread only calls batch_at() and pushes into a bounded queue; all
// shared state is behind one mutex and one condition variable.
#include "worker/data/batcher.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <numeric>

#include "common/errors.h"
#include "common/thread_name.h"

namespace dtrain::data {
namespace {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;

std::vector<int64_t> make_shard(const Dataset& data, const BatchStreamOptions& options) {
  DT_ENFORCE(options.worker_count > 0 && options.worker_index >= 0 &&
                 options.worker_index < options.worker_count,
             "worker {} of {}", options.worker_index, options.worker_count);
  DT_ENFORCE(options.batch_size > 0, "batch size {}", options.batch_size);
  DT_ENFORCE(options.epoch >= 0, "epoch {}", options.epoch);
  DT_ENFORCE(options.first_step >= 0 && options.first_step <= options.steps, "steps {} .. {}",
             options.first_step, options.steps);
  DT_ENFORCE(options.timeout.count() > 0, "timeout {} ms", options.timeout.count());
  if (!data.is_text()) {
    DT_ENFORCE_EQ(data.pixel_count(),
                  static_cast<size_t>(data.count * data.height * data.width * data.channels));
    DT_ENFORCE_EQ(data.labels.size(), static_cast<size_t>(data.count * data.label_width()));
  }
  if (data.count < options.worker_count) {
    throw common::ConfigError(fmt::format(
        "data: {} examples cannot be sharded among {} workers (each needs at least one)",
        data.count, options.worker_count));
  }
  return shard(epoch_order(data.count, options.seed, options.epoch), options.worker_index,
               options.worker_count);
}

}  // namespace

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += kGoldenGamma);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::below(uint64_t bound) {
  DT_ENFORCE(bound > 0, "below(0)");
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound: reject the uneven tail
  for (;;) {
    uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

float SplitMix64::unit_float() {
  return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
}

uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  SplitMix64 base(seed);
  SplitMix64 sub(base.next() + stream * kGoldenGamma);
  return sub.next();
}

std::vector<int64_t> epoch_order(int64_t count, uint64_t seed, int epoch) {
  DT_ENFORCE(count >= 0 && epoch >= 0, "epoch_order({}, epoch {})", count, epoch);
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  SplitMix64 rng(derive_seed(seed, static_cast<uint64_t>(epoch)));
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::vector<int64_t> shard(const std::vector<int64_t>& order, int index, int workers) {
  DT_ENFORCE(workers > 0 && index >= 0 && index < workers, "shard {} of {}", index, workers);
  std::vector<int64_t> mine;
  mine.reserve(order.size() / static_cast<size_t>(workers) + 1);
  for (size_t k = static_cast<size_t>(index); k < order.size(); k += static_cast<size_t>(workers))
    mine.push_back(order[k]);
  return mine;
}

int64_t shard_size(int64_t count, int index, int workers) {
  DT_ENFORCE(workers > 0 && index >= 0 && index < workers, "shard {} of {}", index, workers);
  return count / workers + (index < count % workers ? 1 : 0);
}

int64_t default_steps(int64_t shard_size, int batch) {
  DT_ENFORCE(shard_size > 0 && batch > 0, "default_steps({}, {})", shard_size, batch);
  return (shard_size + batch - 1) / batch;
}

BatchStream::BatchStream(const Dataset& dataset, const BatchStreamOptions& options)
    : dataset_(dataset),
      options_(options),
      shard_(make_shard(dataset, options)),
      next_step_(options.first_step),
      producer_([this] { produce(); }) {}

BatchStream::~BatchStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (producer_.joinable()) producer_.join();
}

void BatchStream::produce() noexcept {
  common::name_this_thread("dt-batches");
  // A batch is made a step or more before it is needed, so this thread must never take the
  // training thread's core when it wakes: as SCHED_OTHER it did, after each next() woke it, for
  // the 0.3 ms a batch of 256 takes (docs/benchmarks.md, "the worker between its steps"). As
  // SCHED_BATCH it waits for a time slice instead. Unprivileged; on failure it keeps SCHED_OTHER.
  sched_param no_priority{};
  ::sched_setscheduler(0, SCHED_BATCH, &no_priority);
  try {
    for (int64_t step = options_.first_step; step < options_.steps; ++step) {
      Batch batch = batch_at(step);
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || ready_.size() < kPrefetchDepth; });
      if (stopping_) return;
      ready_.push_back(std::move(batch));
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = std::current_exception();
    changed_.notify_all();
  }
}

Batch BatchStream::next() {
  DT_ENFORCE(next_step_ < options_.steps, "next() after the last step ({})", options_.steps);
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, options_.timeout, [this] { return !ready_.empty() || failure_; });
  if (!ready_.empty()) {
    Batch batch = std::move(ready_.front());
    ready_.pop_front();
    ++next_step_;
    changed_.notify_all();
    return batch;
  }
  if (failure_) std::rethrow_exception(failure_);
  throw common::IoError(
      fmt::format("data: waited {} ms for batch {} of epoch {} from the prefetch thread; none came",
                  options_.timeout.count(), next_step_, options_.epoch));
}

int64_t window_offset(const Dataset& data, uint64_t seed, int epoch, int64_t step,
                      int64_t example) {
  DT_ENFORCE(data.is_text() && data.token_count > data.height, "window_offset of {} tokens",
             data.token_count);
  const uint64_t of_step =
      derive_seed(derive_seed(seed, static_cast<uint64_t>(epoch)), static_cast<uint64_t>(step));
  SplitMix64 rng(derive_seed(of_step, static_cast<uint64_t>(example)));
  return static_cast<int64_t>(rng.below(static_cast<uint64_t>(data.token_count - data.height)));
}

std::vector<int64_t> BatchStream::ids_at(int64_t step) const {
  DT_ENFORCE(step >= 0, "step {}", step);
  if (dataset_.is_text()) {
    std::vector<int64_t> offsets(static_cast<size_t>(options_.batch_size));
    for (int64_t j = 0; j < options_.batch_size; ++j)
      offsets[static_cast<size_t>(j)] =
          window_offset(dataset_, options_.seed, options_.epoch, step,
                        int64_t{options_.worker_index} * options_.batch_size + j);
    return offsets;
  }
  const auto count = static_cast<int64_t>(shard_.size());
  std::vector<int64_t> ids(static_cast<size_t>(options_.batch_size));
  for (int64_t j = 0; j < options_.batch_size; ++j)
    ids[static_cast<size_t>(j)] =
        shard_[static_cast<size_t>((step * options_.batch_size + j) % count)];
  return ids;
}

Batch BatchStream::batch_at(int64_t step) const {
  DT_ENFORCE(step >= 0, "step {}", step);
  const int64_t batch_size = options_.batch_size;
  const int64_t pixels = int64_t{dataset_.height} * dataset_.width * dataset_.channels;
  const auto count = static_cast<int64_t>(shard_.size());
  Batch batch;
  batch.size = batch_size;
  batch.images.resize(static_cast<size_t>(batch_size * pixels));
  if (dataset_.is_text()) {
    const std::vector<int64_t> offsets = ids_at(step);
    batch.labels.resize(static_cast<size_t>(batch_size * pixels));
    for (int64_t j = 0; j < batch_size; ++j)
      copy_window(dataset_, offsets[static_cast<size_t>(j)], batch.images.data() + j * pixels,
                  batch.labels.data() + j * pixels);
    return batch;
  }
  const int64_t width = dataset_.label_width();
  batch.labels.resize(static_cast<size_t>(batch_size * width));
  for (int64_t j = 0; j < batch_size; ++j) {
    const int64_t example = shard_[static_cast<size_t>((step * batch_size + j) % count)];
    copy_example_chw(dataset_, example, batch.images.data() + j * pixels);
    std::copy_n(dataset_.labels.begin() + example * width, width, batch.labels.begin() + j * width);
  }
  return batch;
}

}  // namespace dtrain::data
