// The loop of an optimizer update on the host, split over OpenMP's threads, that writes large
// arrays with non-temporal stores. An update reads each weight, its gradient and its slots and
// writes the weight and slots back: a plain store first reads the line it writes (for ownership),
// so of SGD with momentum's five passes over the parameters' size, two are such reads, and a
// model whose parameters exceed the cache pays for them in memory bandwidth. Here each block of
// 64 elements is computed into the thread's own buffers and streamed out (SSE's movntps, on every
// x86-64), which skips those reads (docs/design.md#optimizer-updates-on-the-host). The arithmetic
// is the same expression either way, so the results are the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#if defined(__x86_64__)  // SSE is part of x86-64
#include <immintrin.h>
#define DT_STREAMED_STORES 1
#endif

namespace dtrain::nn::streamed_update {

/// Updates of fewer elements use plain stores: their arrays may still be in the cache when the
/// next forward pass reads them, and there skipping the cache would cost more than it saves.
constexpr int64_t kStreamAt = int64_t{1} << 18;
/// Elements per block: four cache lines of each array.
constexpr int64_t kBlock = 64;

/// Whether an update of n elements to these arrays streams: n large enough, and every array at
/// the same offset from a 16-byte boundary, so whole blocks start aligned in all of them.
template <class... Out>
bool streams(int64_t n, Out*... outs) {
#ifdef DT_STREAMED_STORES
  const uintptr_t phases[] = {reinterpret_cast<uintptr_t>(outs) % 16 ...};
  for (uintptr_t phase : phases)
    if (phase != phases[0] || phase % sizeof(float) != 0) return false;
  return n >= kStreamAt;
#else
  (void)n, ((void)outs, ...);
  return false;
#endif
}

namespace detail {

template <class Update, class... Out, size_t... I>
void run_blocks(int64_t first, int64_t blocks, Update& update, std::index_sequence<I...>,
                Out*... outs) {
#ifdef DT_STREAMED_STORES
#pragma omp parallel
  {
    alignas(64) float results[sizeof...(Out)][kBlock];
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = first + b * kBlock;
#pragma omp simd
      for (int64_t j = 0; j < kBlock; ++j) update(at + j, results[I][j]...);
      (
          [&] {
            for (int64_t j = 0; j < kBlock; j += 4)
              _mm_stream_ps(outs + at + j, _mm_load_ps(results[I] + j));
          }(),
          ...);
    }
    // Streamed stores are weakly ordered: each thread fences its own before the region's
    // barrier, so they are visible before anything after the update runs.
    _mm_sfence();
  }
#else
  (void)first, (void)blocks, (void)update, ((void)outs, ...);
#endif
}

}  // namespace detail

/// Runs update(i, out_0, ..., out_k) for every i in [0, n), where update reads element i of its
/// inputs and the arrays outs point to and sets out_j to the new value of outs[j][i]; the new
/// values land in outs, streamed where streams() says so, else by plain stores.
template <class Update, class... Out>
void run(int64_t n, Update update, Out*... outs) {
  if (!streams(n, outs...)) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) update(i, outs[i]...);
    return;
  }
  // Plain stores up to the first 16-byte boundary (where every array has one: streams()) and
  // past the last whole block.
  const void* any_out = std::get<0>(std::make_tuple(outs...));
  const int64_t head =
      static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(any_out) % 16) % 16 / sizeof(float));
  const int64_t blocks = (n - head) / kBlock;
  for (int64_t i = 0; i < head; ++i) update(i, outs[i]...);
  detail::run_blocks(head, blocks, update, std::index_sequence_for<Out...>{}, outs...);
  for (int64_t i = head + blocks * kBlock; i < n; ++i) update(i, outs[i]...);
}

}  // namespace dtrain::nn::streamed_update
