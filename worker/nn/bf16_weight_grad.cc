// See bf16_weight_grad.h.
#include "worker/nn/bf16_weight_grad.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "worker/nn/avx512_bf16.h"
#include "worker/nn/backend.h"

namespace dtrain::nn::bf16_weight_grad {
namespace {

constexpr int kBlock = kChannelBlock;   // channels per block, and AVX-512's float lanes
constexpr int kRanges = 4;              // the pairs of examples in ranges, summed apart
constexpr int kBandPixels = 192;        // output pixels per band: its x and dy fit in L1
constexpr int kPairWidth = 2 * kBlock;  // bf16 per paired pixel: 16 channels, two examples

#if defined(__x86_64__) && defined(__GNUC__)
DT_AVX512_INTRINSICS_BEGIN

// The index that interleaves two vectors of 16 bf16, a's and b's: a0 b0 a1 b1 ...
alignas(64) const uint16_t kInterleave[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                              37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                              11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

// A tensor in blocks of 16 channels (nChw16c): where row `row` of block `block` of example n
// starts.
struct Blocked {
  int n, blocks, rows, cols;
  const uint16_t* row(const uint16_t* t, int example, int block, int r) const {
    return t + ((static_cast<size_t>(example) * blocks + block) * rows + r) * cols * kBlock;
  }
};

// Row `r` of block `block` of examples 2 * pair and 2 * pair + 1 of t interleaved into out, one
// pixel of 32 bf16 (the 16 channels' pairs) after another; the second example is zeros past an
// odd batch's end.
DT_TARGET_AVX512_BF16 void pair_row(const Blocked& b, const uint16_t* t, int pair, int block, int r,
                                    uint16_t* out) {
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const uint16_t* first = b.row(t, 2 * pair, block, r);
  const uint16_t* second = 2 * pair + 1 < b.n ? b.row(t, 2 * pair + 1, block, r) : nullptr;
  for (int col = 0; col < b.cols; ++col) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + col * kBlock));
    const __m256i x1 =
        second ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + col * kBlock))
               : _mm256_setzero_si256();
    _mm512_store_si512(out + static_cast<size_t>(col) * kPairWidth,
                       _mm512_permutex2var_epi16(_mm512_castsi256_si512(x0), interleave,
                                                 _mm512_castsi256_si512(x1)));
  }
}

// A band: the pairs [pair0, pair1) and output rows [row0, row1) of each, with the x rows they
// read, small enough that its paired x and dy stay in L1 while every kernel position runs over
// it. The bands of a range of pairs, in order, visit its (pair, row) in order.
struct Bands {
  int pairs_per_band, rows_per_band;  // one of them covers a whole image or a single pair
  int x_rows;                         // x rows a band's output rows read (in the image or not)
  size_t x_count, dy_count;           // bf16 of a band's paired x and dy
};

Bands plan_bands(const ConvShape& s) {
  Bands b{};
  const int oh = s.oh(), ow = s.ow();
  if (oh * ow >= kBandPixels) {
    b.pairs_per_band = 1;
    const int bands = (oh + std::max(1, kBandPixels / ow) - 1) / std::max(1, kBandPixels / ow);
    b.rows_per_band = (oh + bands - 1) / bands;
  } else {
    b.pairs_per_band = std::max(1, kBandPixels / (oh * ow));
    b.rows_per_band = oh;
  }
  b.x_rows = (b.rows_per_band - 1) * s.sh + s.kh;
  b.x_count = static_cast<size_t>(b.pairs_per_band) * b.x_rows * s.w * kPairWidth;
  b.dy_count = static_cast<size_t>(b.pairs_per_band) * b.rows_per_band * ow * kPairWidth;
  return b;
}

// One band of one task: x's and dy's pairs written into x_band and dy_band (64-byte aligned),
// then each kernel position (i, j) in turn runs 16 accumulators (one per input channel) of 16
// output channels each over the band's pairs, rows and columns, from and back to acc (kh x kw x
// 16 x 16 floats). Positions outside the image are skipped, not multiplied by zero: for (i, j),
// only the rows and columns whose x is in the image. dy's pair (16 output channels, two
// examples) is one vector; x's (one input channel, two examples) is broadcast from memory.
DT_TARGET_AVX512_BF16 void run_band(const ConvShape& s, const Bands& bands, const Blocked& xb,
                                    const Blocked& dyb, const uint16_t* x16, const uint16_t* dy16,
                                    int kb, int cb, int pair0, int pair1, int row0, int row1,
                                    uint16_t* x_band, uint16_t* dy_band, float* acc_memory) {
  const int ow = dyb.cols, w = s.w;
  const int x_row0 = row0 * s.sh - s.pad_top;  // x_band's first row
  const size_t x_pair_step = static_cast<size_t>(bands.x_rows) * w * kPairWidth;
  const size_t dy_pair_step = static_cast<size_t>(bands.rows_per_band) * ow * kPairWidth;
  for (int pair = pair0; pair < pair1; ++pair) {
    uint16_t* xp = x_band + (pair - pair0) * x_pair_step;
    uint16_t* dyp = dy_band + (pair - pair0) * dy_pair_step;
    for (int p = row0; p < row1; ++p)
      pair_row(dyb, dy16, pair, kb, p, dyp + static_cast<size_t>(p - row0) * ow * kPairWidth);
    // The x rows some (p, i) reads, in the image.
    for (int r = std::max(0, x_row0); r < std::min(s.h, x_row0 + bands.x_rows); ++r) {
      bool read = false;
      for (int i = 0; i < s.kh && !read; ++i) {
        const int offset = r + s.pad_top - i;  // p * sh
        read = offset >= row0 * s.sh && offset < row1 * s.sh && offset % s.sh == 0;
      }
      if (read)
        pair_row(xb, x16, pair, cb, r, xp + static_cast<size_t>(r - x_row0) * w * kPairWidth);
    }
  }
  const size_t x_step = static_cast<size_t>(s.sw) * kPairWidth;
  for (int i = 0; i < s.kh; ++i) {
    for (int j = 0; j < s.kw; ++j) {
      // The columns q whose x column q * sw + j - pad_left is in the image: q * sw <= last.
      const int last = w - 1 - j + s.pad_left;
      if (last < 0) continue;
      const int q_lo = std::max(0, (s.pad_left - j + s.sw - 1) / s.sw);
      const int q_hi = std::min(ow, last / s.sw + 1);
      if (q_lo >= q_hi) continue;
      float* slot = acc_memory + (static_cast<size_t>(i) * s.kw + j) * kBlock * kBlock;
      __m512 acc[kBlock];
#pragma GCC unroll 16
      for (int c = 0; c < kBlock; ++c) acc[c] = _mm512_loadu_ps(slot + c * kBlock);
      for (int pair = pair0; pair < pair1; ++pair) {
        const uint16_t* xp = x_band + (pair - pair0) * x_pair_step;
        const uint16_t* dyp = dy_band + (pair - pair0) * dy_pair_step;
        for (int p = row0; p < row1; ++p) {
          const int r = p * s.sh + i - s.pad_top;
          if (r < 0 || r >= s.h) continue;
          const uint16_t* dy_row = dyp + static_cast<size_t>(p - row0) * ow * kPairWidth;
          const uint16_t* x_col = xp + static_cast<size_t>(r - x_row0) * w * kPairWidth +
                                  static_cast<size_t>(q_lo * s.sw + j - s.pad_left) * kPairWidth;
          for (int q = q_lo; q < q_hi; ++q, x_col += x_step) {
            const __m512bh a = reinterpret_cast<__m512bh>(
                _mm512_load_si512(dy_row + static_cast<size_t>(q) * kPairWidth));
#pragma GCC unroll 16
            for (int c = 0; c < kBlock; ++c) {
              int32_t word;
              std::memcpy(&word, x_col + 2 * c, sizeof word);
              acc[c] =
                  _mm512_dpbf16_ps(acc[c], a, reinterpret_cast<__m512bh>(_mm512_set1_epi32(word)));
            }
          }
        }
      }
#pragma GCC unroll 16
      for (int c = 0; c < kBlock; ++c) _mm512_storeu_ps(slot + c * kBlock, acc[c]);
    }
  }
}

DT_TARGET_AVX512_BF16 void compute_avx512_bf16(const ConvShape& s, const uint16_t* x16,
                                               const uint16_t* dy16, float* dw, Scratch& scratch) {
  const int pairs = (s.n + 1) / 2, oh = s.oh();
  const Blocked xb{s.n, s.c / kBlock, s.h, s.w};
  const Blocked dyb{s.n, s.k / kBlock, oh, s.ow()};
  const Bands bands = plan_bands(s);
  // Each thread's band, 64-byte aligned (a paired pixel is 64 bytes).
  const size_t per_thread = bands.x_count + bands.dy_count;
  const int threads = omp_get_max_threads();
  if (scratch.bands.size() < threads * per_thread + kPairWidth)
    scratch.bands.resize(threads * per_thread + kPairWidth);
  uint16_t* band_memory = scratch.bands.data();
  band_memory +=
      (kPairWidth - reinterpret_cast<uintptr_t>(band_memory) / 2 % kPairWidth) % kPairWidth;
  // A task: a block of output channels, one of input channels, and one of kRanges fixed ranges
  // of the pairs, into its own partial sums; the ranges' sums are added in range order. Neither
  // depends on the thread count: the same bits at every one.
  const size_t per_block = static_cast<size_t>(s.kh) * s.kw * kBlock * kBlock;
  const int blocks = dyb.blocks * xb.blocks, tasks = blocks * kRanges;
  std::vector<float>& partial = scratch.partial;
  if (partial.size() < static_cast<size_t>(tasks) * per_block)
    partial.resize(static_cast<size_t>(tasks) * per_block);
#pragma omp parallel for schedule(dynamic)
  for (int task = 0; task < tasks; ++task) {
    const int range = task % kRanges, block = task / kRanges;
    const int kb = block / xb.blocks, cb = block % xb.blocks;
    uint16_t* x_band = band_memory + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    uint16_t* dy_band = x_band + bands.x_count;
    float* acc = partial.data() + static_cast<size_t>(task) * per_block;
    std::fill(acc, acc + per_block, 0.0f);
    const int first = pairs * range / kRanges, last = pairs * (range + 1) / kRanges;
    for (int pair = first; pair < last; pair += bands.pairs_per_band)
      for (int row = 0; row < oh; row += bands.rows_per_band)
        run_band(s, bands, xb, dyb, x16, dy16, kb, cb, pair,
                 std::min(last, pair + bands.pairs_per_band), row,
                 std::min(oh, row + bands.rows_per_band), x_band, dy_band, acc);
  }
  // partial: per task, (i, j, c, k lane); dw: OIHW.
  for (int block = 0; block < blocks; ++block) {
    const int kb = block / xb.blocks, cb = block % xb.blocks;
    for (int i = 0; i < s.kh; ++i)
      for (int j = 0; j < s.kw; ++j)
        for (int c = 0; c < kBlock; ++c)
          for (int l = 0; l < kBlock; ++l) {
            const size_t at = ((static_cast<size_t>(i) * s.kw + j) * kBlock + c) * kBlock + l;
            float sum = partial[static_cast<size_t>(block) * kRanges * per_block + at];
            for (int r = 1; r < kRanges; ++r)
              sum += partial[(static_cast<size_t>(block) * kRanges + r) * per_block + at];
            const size_t k = static_cast<size_t>(kb) * kBlock + l;
            const size_t ch = static_cast<size_t>(cb) * kBlock + c;
            dw[((k * s.c + ch) * s.kh + i) * s.kw + j] = sum;
          }
  }
}
DT_AVX512_INTRINSICS_END
#endif

}  // namespace

bool suits(const ConvShape& s) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool cpu = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512bw") &&
                          own_kernels_may_use(VectorIsa::kAvx512Bf16);
  return cpu && s.c % kBlock == 0 && s.k % kBlock == 0 && s.x_layout == Layout::kBlocked &&
         s.y_layout == Layout::kBlocked && !s.bias && s.oh() > 0 && s.ow() > 0;
#else
  (void)s;
  return false;
#endif
}

void compute(const ConvShape& s, const uint16_t* x16, const uint16_t* dy16, float* dw,
             Scratch& scratch) {
  DT_ENFORCE(suits(s), "the bf16 weight gradient's kernel does not take this shape");
#if defined(__x86_64__) && defined(__GNUC__)
  compute_avx512_bf16(s, x16, dy16, dw, scratch);
#else
  (void)x16, (void)dy16, (void)dw, (void)scratch;
#endif
}

}  // namespace dtrain::nn::bf16_weight_grad
