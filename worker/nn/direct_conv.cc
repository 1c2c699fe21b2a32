// See direct_conv.h. Each image is first copied into a zero-padded buffer wide enough that every
// output row can be computed a whole vector width at a time with no bounds checks (the columns
// past the row's end are computed and dropped). The forward keeps an output row's sums in
// registers across the kernel's taps; the weight gradient keeps one tap's sums in registers
// across the rows of a plane. Compiled for AVX-512, AVX2 and plain x86-64, picked at run time.
#include "worker/nn/direct_conv.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/errors.h"

namespace dtrain::nn::direct_conv {
namespace {

/// The loops' bodies are compiled into each wrapper below for its vector width (the build
/// itself targets plain x86-64); they must inline there, so they are always_inline.
#define DT_INLINE inline __attribute__((always_inline))

/// float32 to the nearest bf16 (ties to even), as a float; NaN stays NaN. The reference backend
/// keeps its own copy on purpose: it is the oracle these loops are tested against.
inline float bf16_value(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  bits = (bits & 0x7fffffffu) > 0x7f800000u ? bits : rounded;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// Where one image's padded copy puts things, and each kernel tap's offset in it.
struct Geometry {
  int oh = 0, ow = 0;
  int row = 0;           ///< output columns computed per row: ow rounded up to 16
  int padded_h = 0;      ///< rows of the padded copy
  int padded_w = 0;      ///< its columns: enough for `row` outputs (stride 1 along a row)
  size_t channel = 0;    ///< floats per channel of the padded copy
  int taps = 0;          ///< c * kh * kw
  std::vector<int> tap;  ///< each tap's (c, i, j) offset in the padded copy
};

Geometry geometry_of(const ConvShape& s) {
  Geometry g;
  g.oh = s.oh(), g.ow = s.ow();
  g.row = (g.ow + 15) / 16 * 16;
  g.padded_h = (g.oh - 1) * s.sh + s.kh;
  g.padded_w = g.row + s.kw - 1;
  g.channel = static_cast<size_t>(g.padded_h) * g.padded_w;
  g.taps = s.c * s.kh * s.kw;
  for (int c = 0; c < s.c; ++c)
    for (int i = 0; i < s.kh; ++i)
      for (int j = 0; j < s.kw; ++j)
        g.tap.push_back(static_cast<int>(c * g.channel) + i * g.padded_w + j);
  return g;
}

/// image (c, h, w) into padded (zeros around it, rounded to bf16 when asked).
void pad_image(const ConvShape& s, const Geometry& g, const float* image, float* padded,
               bool bf16) {
  std::fill(padded, padded + s.c * g.channel, 0.0f);
  for (int c = 0; c < s.c; ++c) {
    for (int h = 0; h < s.h; ++h) {
      const int ph = h + s.pad_top;
      if (ph >= g.padded_h) break;
      const float* in = image + (static_cast<size_t>(c) * s.h + h) * s.w;
      float* out = padded + c * g.channel + static_cast<size_t>(ph) * g.padded_w + s.pad_left;
      const int columns = std::min(s.w, g.padded_w - s.pad_left);
      for (int w = 0; w < columns; ++w) out[w] = bf16 ? bf16_value(in[w]) : in[w];
    }
  }
}

/// 16 floats: GCC's and Clang's vector extension, one AVX-512 register, two AVX2 ones, four SSE
/// ones in the clones below. Read and written through pointers (unaligned, aliasing floats) and
/// kept local: never an argument or a result, whose ABI differs per clone.
typedef float Vec16 __attribute__((vector_size(64), aligned(4), may_alias));
constexpr int kLanes = 16;
inline const Vec16& at16(const float* p) {
  return *reinterpret_cast<const Vec16*>(p);
}

/// kLanes floats as one generic vector, and 8 for the AVX2 loops: under AVX2 GCC keeps a
/// 16-float vector on the stack, storing and reloading it around every operation (6.65 ms for a
/// 64x1x28x28 forward against 3.18 in the plain loops; 0.57 with 8). Each output's operations
/// are the same at either size.
/// (A template argument would drop the typedef's alignment of 4: the vectors are named here.)
template <int L>
struct VectorOf;
template <>
struct VectorOf<8> {
  typedef float type __attribute__((vector_size(32), aligned(4), may_alias));
};
template <>
struct VectorOf<kLanes> {
  typedef Vec16 type;
};

/// One image's k output planes: y = b + sum over taps of weight * shifted input (then ReLU), in
/// vectors of L floats. Rows of L or more columns are stored a vector at a time straight into
/// y, the last vector overlapping the one before it where L does not divide the row; shorter
/// rows go through row_sums (g.row floats).
template <int L>
DT_INLINE void forward_image(const ConvShape& s, const Geometry& g, const float* padded,
                             const float* w, const float* b, float* y, bool relu,
                             float* __restrict row_sums) {
  const int taps = g.taps, ow = g.ow;
  const int* tap = g.tap.data();
  const bool direct = ow >= L;
  typedef typename VectorOf<L>::type V;
  for (int k = 0; k < s.k; ++k) {
    const float* filter = w + static_cast<size_t>(k) * taps;
    for (int oh = 0; oh < g.oh; ++oh) {
      const float* base = padded + static_cast<size_t>(oh) * s.sh * g.padded_w;
      float* out = y + (static_cast<size_t>(k) * g.oh + oh) * ow;
      for (int start = 0; start < ow; start += L) {
        const int t = direct ? std::min(start, ow - L) : start;
        V sum = V{} + b[k];
        for (int p = 0; p < taps; ++p)
          sum += filter[p] * *reinterpret_cast<const V*>(base + tap[p] + t);
        if (relu) sum = sum < 0.0f ? V{} : sum;
        *reinterpret_cast<V*>(direct ? out + t : row_sums + t) = sum;
      }
      if (!direct) std::memcpy(out, row_sums, sizeof(float) * ow);
    }
  }
}

/// The 16 floats at p rounded to bf16 in place (bf16_value on each).
inline void round16(float* p) {
  typedef uint32_t Bits16 __attribute__((vector_size(64), aligned(4), may_alias));
  Bits16& bits = *reinterpret_cast<Bits16*>(p);
  const Bits16 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  bits = (bits & 0x7fffffffu) > 0x7f800000u ? bits : rounded;
}

/// The sum of the first `count` (<= 16) floats at p, in double.
inline double sum_of(const float* p, int count) {
  double sum = 0.0;
  for (int l = 0; l < count; ++l) sum += p[l];
  return sum;
}

/// dz = dy where mask > 0 (or dy), rounded when bf16, for one plane of `plane` floats; returns
/// its sum (the bias gradient's share).
DT_INLINE double masked_plane(const float* dy, const float* mask, bool bf16, int plane,
                              float* __restrict dz) {
  Vec16 sum{};
  int t = 0;
  for (; t + kLanes <= plane; t += kLanes) {
    Vec16& z = *reinterpret_cast<Vec16*>(dz + t);
    z = mask ? (at16(mask + t) > 0.0f ? at16(dy + t) : Vec16{}) : at16(dy + t);
    if (bf16) round16(dz + t);
    sum += z;
  }
  float lanes[kLanes];
  std::memcpy(lanes, &sum, sizeof lanes);
  double total = sum_of(lanes, kLanes);
  for (; t < plane; ++t) {
    const float v = mask && !(mask[t] > 0.0f) ? 0.0f : dy[t];
    dz[t] = bf16 ? bf16_value(v) : v;
    total += dz[t];
  }
  return total;
}

/// One image's contribution to dw (k x taps) and db (k), in float32, added to its double
/// totals. dz holds oh * ow + g.row floats (its tail is read as padding and dropped). Three taps
/// (a kernel row, for 3x3) at a time share each load of dz and keep three sums in flight.
DT_INLINE void weights_image(const ConvShape& s, const Geometry& g, const float* padded,
                             const float* dy, const float* mask, bool bf16, float* __restrict dz,
                             double* dw, double* db) {
  const int ow = g.ow, plane = g.oh * g.ow;
  const size_t row_step = static_cast<size_t>(s.sh) * g.padded_w;
  for (int k = 0; k < s.k; ++k) {
    const size_t at = static_cast<size_t>(k) * plane;
    db[k] += masked_plane(dy + at, mask ? mask + at : nullptr, bf16, plane, dz);
    for (int p = 0; p < g.taps; p += 3) {
      const int group = std::min(3, g.taps - p);
      const float* in[3];
      for (int q = 0; q < 3; ++q) in[q] = padded + g.tap[p + std::min(q, group - 1)];
      for (int t = 0; t < g.row; t += kLanes) {
        Vec16 sum[3] = {};
        for (int oh = 0; oh < g.oh; ++oh) {
          const Vec16 z = at16(dz + oh * ow + t);
          const size_t r = oh * row_step + t;
          sum[0] += z * at16(in[0] + r);
          sum[1] += z * at16(in[1] + r);
          sum[2] += z * at16(in[2] + r);
        }
        float lanes[3][kLanes];
        std::memcpy(lanes, sum, sizeof lanes);
        for (int q = 0; q < group; ++q)
          dw[static_cast<size_t>(k) * g.taps + p + q] += sum_of(lanes[q], std::min(kLanes, ow - t));
      }
    }
  }
}

/// The loops compiled for one vector width.
struct Kernels {
  void (*forward_image)(const ConvShape&, const Geometry&, const float*, const float*, const float*,
                        float*, bool, float*);
  void (*weights_image)(const ConvShape&, const Geometry&, const float*, const float*, const float*,
                        bool, float*, double*, double*);
};

void forward_plain(const ConvShape& s, const Geometry& g, const float* padded, const float* w,
                   const float* b, float* y, bool relu, float* row_sums) {
  forward_image<kLanes>(s, g, padded, w, b, y, relu, row_sums);
}
void weights_plain(const ConvShape& s, const Geometry& g, const float* padded, const float* dy,
                   const float* mask, bool bf16, float* dz, double* dw, double* db) {
  weights_image(s, g, padded, dy, mask, bf16, dz, dw, db);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void forward_avx2(const ConvShape& s, const Geometry& g,
                                                      const float* padded, const float* w,
                                                      const float* b, float* y, bool relu,
                                                      float* row_sums) {
  forward_image<8>(s, g, padded, w, b, y, relu, row_sums);
}
__attribute__((target("avx2,fma"))) void weights_avx2(const ConvShape& s, const Geometry& g,
                                                      const float* padded, const float* dy,
                                                      const float* mask, bool bf16, float* dz,
                                                      double* dw, double* db) {
  weights_image(s, g, padded, dy, mask, bf16, dz, dw, db);
}
__attribute__((target("avx512f"))) void forward_avx512(const ConvShape& s, const Geometry& g,
                                                       const float* padded, const float* w,
                                                       const float* b, float* y, bool relu,
                                                       float* row_sums) {
  forward_image<kLanes>(s, g, padded, w, b, y, relu, row_sums);
}
__attribute__((target("avx512f"))) void weights_avx512(const ConvShape& s, const Geometry& g,
                                                       const float* padded, const float* dy,
                                                       const float* mask, bool bf16, float* dz,
                                                       double* dw, double* db) {
  weights_image(s, g, padded, dy, mask, bf16, dz, dw, db);
}
#endif

Kernels kernels_for(Vectors vectors) {
  if (vectors == Vectors::kWidest) vectors = widest();
  DT_ENFORCE(runs(vectors), "this CPU cannot run the direct convolution's {} loops",
             vectors_name(vectors));
  switch (vectors) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx512:
      return {forward_avx512, weights_avx512};
    case Vectors::kAvx2:
      return {forward_avx2, weights_avx2};
#endif
    default:
      return {forward_plain, weights_plain};
  }
}

}  // namespace

const char* vectors_name(Vectors vectors) {
  switch (vectors) {
    case Vectors::kWidest:
      return "widest";
    case Vectors::kAvx512:
      return "avx512";
    case Vectors::kAvx2:
      return "avx2";
    case Vectors::kPlain:
      return "plain";
  }
  return "?";
}

bool runs(Vectors vectors) {
  switch (vectors) {
    case Vectors::kWidest:
    case Vectors::kPlain:
      return true;
#if defined(__x86_64__) && defined(__GNUC__)
    case Vectors::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             own_kernels_may_use(VectorIsa::kAvx2);
    case Vectors::kAvx512:
      return __builtin_cpu_supports("avx512f") && own_kernels_may_use(VectorIsa::kAvx512);
#endif
    default:
      return false;
  }
}

Vectors widest() {
  return runs(Vectors::kAvx512) ? Vectors::kAvx512
         : runs(Vectors::kAvx2) ? Vectors::kAvx2
                                : Vectors::kPlain;
}

bool suits(const ConvShape& s) {
  return s.sw == 1 && s.c * s.kh * s.kw <= 32;
}

void forward(const ConvShape& s, const float* x, const float* w, const float* b, float* y,
             bool relu, bool bf16, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const Geometry g = geometry_of(s);
  std::vector<float> w16;
  if (bf16) {
    w16.assign(w, w + s.weight_count());
    for (float& v : w16) v = bf16_value(v);
    w = w16.data();
  }
  const size_t image = static_cast<size_t>(s.c) * s.h * s.w;
  const size_t out_image = static_cast<size_t>(s.k) * g.oh * g.ow;
#pragma omp parallel
  {
    std::vector<float> padded(s.c * g.channel), row_sums(g.row);
#pragma omp for schedule(static)
    for (int n = 0; n < s.n; ++n) {
      pad_image(s, g, x + n * image, padded.data(), bf16);
      kernels.forward_image(s, g, padded.data(), w, b, y + n * out_image, relu, row_sums.data());
    }
  }
}

void backward_weights(const ConvShape& s, const float* x, const float* mask, const float* dy,
                      float* dw, float* db, bool bf16, Vectors vectors) {
  const Kernels kernels = kernels_for(vectors);
  const Geometry g = geometry_of(s);
  const size_t image = static_cast<size_t>(s.c) * s.h * s.w;
  const size_t out_image = static_cast<size_t>(s.k) * g.oh * g.ow;
  const size_t weights = static_cast<size_t>(s.k) * g.taps;
  const int most_threads = omp_get_max_threads();
  std::vector<double> thread_dw(most_threads * weights, 0.0), thread_db(most_threads * s.k, 0.0);
#pragma omp parallel
  {
    const int thread = omp_get_thread_num();
    std::vector<float> padded(s.c * g.channel);
    std::vector<float> dz(static_cast<size_t>(g.oh) * g.ow + g.row, 0.0f);
#pragma omp for schedule(static)
    for (int n = 0; n < s.n; ++n) {
      pad_image(s, g, x + n * image, padded.data(), bf16);
      kernels.weights_image(s, g, padded.data(), dy + n * out_image,
                            mask ? mask + n * out_image : nullptr, bf16, dz.data(),
                            thread_dw.data() + thread * weights,
                            thread_db.data() + static_cast<size_t>(thread) * s.k);
    }
  }
  // The threads' totals in thread order: the same result for the same thread count.
  for (size_t at = 0; at < weights; ++at) {
    double sum = 0.0;
    for (int t = 0; t < most_threads; ++t) sum += thread_dw[t * weights + at];
    dw[at] = static_cast<float>(sum);
  }
  for (int k = 0; k < s.k; ++k) {
    double sum = 0.0;
    for (int t = 0; t < most_threads; ++t) sum += thread_db[static_cast<size_t>(t) * s.k + k];
    db[k] = static_cast<float>(sum);
  }
}

}  // namespace dtrain::nn::direct_conv
