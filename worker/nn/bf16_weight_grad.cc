// See bf16_weight_grad.h.
#include "worker/nn/bf16_weight_grad.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "worker/nn/avx512_bf16.h"
#include "worker/nn/backend.h"

namespace dtrain::nn::bf16_weight_grad {
namespace {

constexpr int kBlock = kChannelBlock;  // channels per block, and AVX-512's float lanes
constexpr int kRanges = 4;             // the pairs of examples in ranges, summed apart

#if defined(__x86_64__) && defined(__GNUC__)
DT_AVX512_INTRINSICS_BEGIN

// The tensors with examples in pairs: for each pair of examples, block of channels and pixel,
// the 16 channels' two values side by side (channel c's pair is one 32-bit word, the dot
// product's pair), 32 bf16 per pixel. x is laid out padded (rows and columns of zeros around
// it), so that every pixel a weight reads exists; a batch of odd size pairs its last example
// with zeros.
struct Paired {
  int pairs, blocks, rows, cols;  ///< rows and cols of the (padded) image
  size_t at(int pair, int block, int row, int col) const {
    return ((static_cast<size_t>(pair) * blocks + block) * rows + row) * cols * 32 +
           static_cast<size_t>(col) * 32;
  }
  size_t count() const { return at(pairs, 0, 0, 0); }
};

// The index that interleaves two vectors of 16 bf16, a's and b's: a0 b0 a1 b1 ...
alignas(64) const uint16_t kInterleave[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                              37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                              11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

// A tensor in blocks of 16 channels (nChw16c): where row `row` of block `block` of example n
// starts.
struct Blocked {
  int blocks, rows, cols;
  size_t at(int n, int block, int row) const {
    return ((static_cast<size_t>(n) * blocks + block) * rows + row) * cols * kBlock;
  }
};

// Pixel (row, col) of block `block` of examples 2 * pair and 2 * pair + 1 of t (nChw16c, n
// examples, `rows` x `cols` pixels) interleaved into out; 0 where the pixel or the example is
// outside t.
DT_TARGET_AVX512_BF16 void pair_pixels(const uint16_t* t, int n, int blocks, int rows, int cols,
                                       int pair, int block, int row, int col, int count,
                                       uint16_t* out) {
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const int first = 2 * pair, second = first + 1;
  for (int k = 0; k < count; ++k, ++col) {
    __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
    if (row >= 0 && row < rows && col >= 0 && col < cols) {
      auto pixel = [&](int example) {
        return t + ((static_cast<size_t>(example) * blocks + block) * rows + row) * cols * kBlock +
               static_cast<size_t>(col) * kBlock;
      };
      a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pixel(first)));
      if (second < n) b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pixel(second)));
    }
    const __m512i both =
        _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), interleave, _mm512_castsi256_si512(b));
    _mm512_storeu_si512(out + static_cast<size_t>(k) * 32, both);
  }
}

// t (nChw16c) paired into out (Paired p), the image placed at (top, left) of p's rows and cols.
DT_TARGET_AVX512_BF16 void pair_tensor(const uint16_t* t, int n, int rows, int cols, int top,
                                       int left, const Paired& p, uint16_t* out) {
  const int tasks = p.pairs * p.blocks;
#pragma omp parallel for schedule(static)
  for (int task = 0; task < tasks; ++task) {
    const int pair = task / p.blocks, block = task % p.blocks;
    for (int row = 0; row < p.rows; ++row)
      pair_pixels(t, n, p.blocks, rows, cols, pair, block, row - top, -left, p.cols,
                  out + p.at(pair, block, row, 0));
  }
}

// The pairs of examples [first, last), in chunks that fit in the core's cache with the image:
// for each chunk, each kernel position (i, j) in turn runs 16 accumulators (one per input
// channel) of 16 output channels each over the chunk's pairs, output rows and columns, in that
// order, from and back to acc (kh x kw x 16 x 16 floats). dy's pair (16 output channels, two
// examples) is one vector; x's (one input channel, two examples) is broadcast from memory.
DT_TARGET_AVX512_BF16 void accumulate(const Paired& xp, const Blocked& dyb, const uint16_t* x,
                                      const uint16_t* dy, const uint16_t* zeros, int kb, int cb,
                                      int first, int last, const ConvShape& s, float* acc_memory) {
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const int oh = dyb.rows, ow = dyb.cols;
  const int chunk = std::max(1, 512 / (oh * ow));  // a few hundred pixels per pass
  const size_t x_step = static_cast<size_t>(s.sw) * 32;
  for (int begin = first; begin < last; begin += chunk) {
    const int end = std::min(last, begin + chunk);
    for (int i = 0; i < s.kh; ++i) {
      for (int j = 0; j < s.kw; ++j) {
        float* slot = acc_memory + (static_cast<size_t>(i) * s.kw + j) * kBlock * kBlock;
        __m512 acc[kBlock];
#pragma GCC unroll 16
        for (int c = 0; c < kBlock; ++c) acc[c] = _mm512_loadu_ps(slot + c * kBlock);
        for (int pair = begin; pair < end; ++pair) {
          for (int p = 0; p < oh; ++p) {
            // dy's two examples' rows, paired as the loop reads them (the second zeros past an
            // odd batch's end).
            const uint16_t* dy_first = dy + dyb.at(2 * pair, kb, p);
            const uint16_t* dy_second =
                2 * pair + 1 < s.n ? dy + dyb.at(2 * pair + 1, kb, p) : zeros;
            const uint16_t* x_row = x + xp.at(pair, cb, p * s.sh + i, j);
            for (int q = 0; q < ow; ++q) {
              const __m512bh a = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(
                  _mm512_castsi256_si512(
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dy_first + q * kBlock))),
                  interleave,
                  _mm512_castsi256_si512(_mm256_loadu_si256(
                      reinterpret_cast<const __m256i*>(dy_second + q * kBlock)))));
              const uint16_t* xq = x_row + q * x_step;
#pragma GCC unroll 16
              for (int c = 0; c < kBlock; ++c) {
                int32_t word;
                std::memcpy(&word, xq + 2 * c, sizeof word);
                acc[c] = _mm512_dpbf16_ps(acc[c], a,
                                          reinterpret_cast<__m512bh>(_mm512_set1_epi32(word)));
              }
            }
          }
        }
#pragma GCC unroll 16
        for (int c = 0; c < kBlock; ++c) _mm512_storeu_ps(slot + c * kBlock, acc[c]);
      }
    }
  }
}

DT_TARGET_AVX512_BF16 void compute_avx512_bf16(const ConvShape& s, const uint16_t* x16,
                                               const uint16_t* dy16, float* dw, Scratch& scratch) {
  const int pairs = (s.n + 1) / 2;
  const Paired xp{pairs, s.c / kBlock, s.h + s.pad_top + s.pad_bottom,
                  s.w + s.pad_left + s.pad_right};
  const Blocked dyb{s.k / kBlock, s.oh(), s.ow()};
  const size_t zeros = static_cast<size_t>(s.ow()) * kBlock;
  if (scratch.paired.size() < xp.count() + zeros) scratch.paired.resize(xp.count() + zeros);
  uint16_t* x = scratch.paired.data();
  std::fill(x + xp.count(), x + xp.count() + zeros, uint16_t{0});
  pair_tensor(x16, s.n, s.h, s.w, s.pad_top, s.pad_left, xp, x);
  // A task: a block of output channels, one of input channels, and one of kRanges fixed ranges
  // of the pairs, into its own partial sums; the ranges' sums are added in range order. Neither
  // depends on the thread count: the same bits at every one.
  const size_t per_block = static_cast<size_t>(s.kh) * s.kw * kBlock * kBlock;
  const int blocks = dyb.blocks * xp.blocks, tasks = blocks * kRanges;
  std::vector<float>& partial = scratch.partial;
  partial.assign(static_cast<size_t>(tasks) * per_block, 0.0f);
#pragma omp parallel for schedule(dynamic)
  for (int task = 0; task < tasks; ++task) {
    const int range = task % kRanges, block = task / kRanges;
    const int kb = block / xp.blocks, cb = block % xp.blocks;
    accumulate(xp, dyb, x, dy16, x + xp.count(), kb, cb, pairs * range / kRanges,
               pairs * (range + 1) / kRanges, s,
               partial.data() + static_cast<size_t>(task) * per_block);
  }
  // partial: per task, (i, j, c, k lane); dw: OIHW.
  for (int block = 0; block < blocks; ++block) {
    const int kb = block / xp.blocks, cb = block % xp.blocks;
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
