// See conv_direct.h. Each block holds one (image, filter) pair's weights in shared memory and
// computes a stretch of its output plane.
#include "worker/mem/cuda/cuda_check.h"
#include "worker/nn/cuda/conv_direct.h"

namespace dtrain::nn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxChannels = 4;

struct Geometry {
  int n, c, h, w, k, oh, ow, sh, sw, pad_top, pad_left;
};

template <int KH, int KW>
__global__ void direct_forward(Geometry g, const float* x, const float* w, const float* b, float* y,
                               bool relu) {
  __shared__ float weights[kMaxChannels * KH * KW];
  int image = blockIdx.y / g.k, k = blockIdx.y % g.k;
  int taps = g.c * KH * KW;
  for (int t = threadIdx.x; t < taps; t += kThreads) weights[t] = w[k * taps + t];
  __syncthreads();
  int plane = g.oh * g.ow;
  int r = blockIdx.x * kThreads + threadIdx.x;
  if (r >= plane) return;
  int oy = r / g.ow, ox = r - oy * g.ow;
  float acc = 0.0f;
  for (int c = 0; c < g.c; ++c) {
    const float* xp = x + (static_cast<size_t>(image) * g.c + c) * g.h * g.w;
#pragma unroll
    for (int i = 0; i < KH; ++i) {
      int iy = oy * g.sh - g.pad_top + i;
#pragma unroll
      for (int j = 0; j < KW; ++j) {
        int ix = ox * g.sw - g.pad_left + j;
        if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
          acc += xp[iy * g.w + ix] * weights[(c * KH + i) * KW + j];
      }
    }
  }
  float v = acc + b[k];
  y[(static_cast<size_t>(image) * g.k + k) * plane + r] = relu ? fmaxf(v, 0.0f) : v;
}

template <int KH, int KW>
void launch(const ConvShape& s, const float* x, const float* w, const float* b, float* y,
            bool relu, cudaStream_t stream) {
  Geometry g{s.n, s.c, s.h, s.w, s.k, s.oh(), s.ow(), s.sh, s.sw, s.pad_top, s.pad_left};
  int plane = g.oh * g.ow;
  dim3 grid(static_cast<unsigned>((plane + kThreads - 1) / kThreads),
            static_cast<unsigned>(s.n * s.k));
  direct_forward<KH, KW><<<grid, kThreads, 0, stream>>>(g, x, w, b, y, relu);
}

}  // namespace

bool has_direct_forward(const ConvShape& s) {
  return s.c <= kMaxChannels && s.kh == s.kw &&
         (s.kh == 1 || s.kh == 2 || s.kh == 3 || s.kh == 5) &&
         static_cast<long long>(s.n) * s.k <= 65535;  // grid.y
}

void conv_direct_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                         float* y, bool relu, cudaStream_t stream) {
  switch (s.kh) {
    case 1:
      launch<1, 1>(s, x, w, b, y, relu, stream);
      break;
    case 2:
      launch<2, 2>(s, x, w, b, y, relu, stream);
      break;
    case 3:
      launch<3, 3>(s, x, w, b, y, relu, stream);
      break;
    default:
      launch<5, 5>(s, x, w, b, y, relu, stream);
      break;
  }
  DT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::nn::cuda
