// See conv_weight_grad.h. Two kernels: partial sums per (filter, channel, chunk of images) with a
// warp-shuffle tree and then the warps in order, and a second pass that adds the chunks in order.
// Each thread walks its image's output plane with 32-bit indices (a 64-bit division per element
// made the first version ten times slower than its memory traffic).
#include <algorithm>

#include "worker/mem/cuda/cuda_check.h"
#include "worker/nn/cuda/conv_weight_grad.h"

namespace dtrain::nn::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

struct Geometry {
  int n, c, h, w, k, oh, ow, sh, sw, pad_top, pad_left;
};

// Chunks of images: enough blocks to fill the GPU, a pure function of the shape.
int chunks_for(const ConvShape& s) {
  int filters = s.k * s.c;
  return std::max(1, std::min(s.n, 2048 / std::max(1, filters)));
}

// dy masked by y > 0 where y is given (ReLU's gradient, fused).
template <int KH, int KW>
__global__ void partial_sums(Geometry g, const float* x, const float* dy, const float* y,
                             float* partials, int chunks) {
  constexpr int kTaps = KH * KW;
  int k = blockIdx.x / g.c, c = blockIdx.x % g.c, chunk = blockIdx.y;
  int per_chunk = (g.n + chunks - 1) / chunks;
  int n0 = chunk * per_chunk, n1 = min(g.n, n0 + per_chunk);
  float acc[kTaps + 1];
#pragma unroll
  for (int t = 0; t <= kTaps; ++t) acc[t] = 0.0f;
  int plane = g.oh * g.ow;
  for (int n = n0; n < n1; ++n) {
    size_t out = (static_cast<size_t>(n) * g.k + k) * plane;
    const float* xp = x + (static_cast<size_t>(n) * g.c + c) * g.h * g.w;
    for (int r = threadIdx.x; r < plane; r += kThreads) {
      int oy = r / g.ow, ox = r - oy * g.ow;
      float grad = dy[out + r];
      if (y && !(y[out + r] > 0.0f)) grad = 0.0f;
#pragma unroll
      for (int i = 0; i < KH; ++i) {
        int iy = oy * g.sh - g.pad_top + i;
#pragma unroll
        for (int j = 0; j < KW; ++j) {
          int ix = ox * g.sw - g.pad_left + j;
          if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
            acc[i * KW + j] += grad * xp[iy * g.w + ix];
        }
      }
      acc[kTaps] += grad;
    }
  }
  __shared__ float warp_sums[kTaps + 1][kWarps];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int t = 0; t <= kTaps; ++t) {
    float v = acc[t];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if (lane == 0) warp_sums[t][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x <= kTaps) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_sums[threadIdx.x][w];
    partials[(static_cast<size_t>(blockIdx.x) * chunks + chunk) * (kTaps + 1) + threadIdx.x] = sum;
  }
}

// One thread per weight (and per bias, from channel 0's blocks): the chunks in order.
__global__ void add_chunks(const float* partials, float* dw, float* db, int filters, int c,
                           int taps, int chunks) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= filters * (taps + 1)) return;
  int filter = i / (taps + 1), t = i % (taps + 1);
  if (t == taps && filter % c != 0) return;  // the bias once per output filter
  float sum = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk)
    sum += partials[(static_cast<size_t>(filter) * chunks + chunk) * (taps + 1) + t];
  if (t < taps)
    dw[static_cast<size_t>(filter) * taps + t] = sum;
  else
    db[filter / c] = sum;
}

template <int KH, int KW>
void launch(const ConvShape& s, const float* x, const float* dy, const float* y, float* partials,
            int chunks, cudaStream_t stream) {
  Geometry g{s.n, s.c, s.h, s.w, s.k, s.oh(), s.ow(), s.sh, s.sw, s.pad_top, s.pad_left};
  dim3 grid(static_cast<unsigned>(s.k * s.c), static_cast<unsigned>(chunks));
  partial_sums<KH, KW><<<grid, kThreads, 0, stream>>>(g, x, dy, y, partials, chunks);
}

}  // namespace

bool has_small_filter_kernel(const ConvShape& s) {
  return s.kh == s.kw && (s.kh == 1 || s.kh == 2 || s.kh == 3 || s.kh == 5);
}

size_t conv_weight_grad_scratch_floats(const ConvShape& s) {
  return static_cast<size_t>(s.k) * s.c * chunks_for(s) * (s.kh * s.kw + 1);
}

void conv_weight_grad(const ConvShape& s, const float* x, const float* dy, const float* relu_y,
                      float* dw, float* db, float* scratch, cudaStream_t stream) {
  int chunks = chunks_for(s);
  switch (s.kh) {
    case 1:
      launch<1, 1>(s, x, dy, relu_y, scratch, chunks, stream);
      break;
    case 2:
      launch<2, 2>(s, x, dy, relu_y, scratch, chunks, stream);
      break;
    case 3:
      launch<3, 3>(s, x, dy, relu_y, scratch, chunks, stream);
      break;
    default:
      launch<5, 5>(s, x, dy, relu_y, scratch, chunks, stream);
      break;
  }
  DT_CUDA_CHECK(cudaGetLastError());
  int filters = s.k * s.c, taps = s.kh * s.kw, threads = filters * (taps + 1);
  add_chunks<<<(threads + 127) / 128, 128, 0, stream>>>(scratch, dw, db, filters, s.c, taps,
                                                        chunks);
  DT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::nn::cuda
