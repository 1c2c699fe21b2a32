// See layer_kernels.h. One thread per output element (per row for the loss).
#include "worker/mem/cuda/cuda_check.h"
#include "worker/nn/cuda/layer_kernels.h"

namespace dtrain::nn::cuda {
namespace {

constexpr int kThreads = 256;
int blocks_for(size_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}

__global__ void pad_kernel(const float* x, float* out, int nc, int h, int w, int top, int left,
                           int ph, int pw) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(nc) * ph * pw) return;
  int ox = static_cast<int>(i % pw), oy = static_cast<int>((i / pw) % ph);
  size_t plane = i / (static_cast<size_t>(ph) * pw);
  int ix = ox - left, iy = oy - top;
  out[i] = (ix >= 0 && ix < w && iy >= 0 && iy < h) ? x[(plane * h + iy) * w + ix] : 0.0f;
}

__global__ void crop_kernel(const float* padded, float* x, int nc, int h, int w, int top, int left,
                            int ph, int pw) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(nc) * h * w) return;
  int ix = static_cast<int>(i % w), iy = static_cast<int>((i / w) % h);
  size_t plane = i / (static_cast<size_t>(h) * w);
  x[i] = padded[(plane * ph + iy + top) * pw + ix + left];
}

__global__ void bias_rows_kernel(float* y, const float* b, int n, int out) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < static_cast<size_t>(n) * out) y[i] += b[i % out];
}

__global__ void bias_rows_relu_kernel(float* y, const float* b, int n, int out) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < static_cast<size_t>(n) * out) y[i] = fmaxf(y[i] + b[i % out], 0.0f);
}

__global__ void bias_planes_relu_kernel(float* y, const float* b, size_t count, int k, int plane) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < count) y[i] = fmaxf(y[i] + b[(i / plane) % k], 0.0f);
}

__global__ void fill_kernel(float* x, size_t n, float value) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = value;
}

// One thread per row: the row's gradient (unless dlogits is null), loss and hit.
__global__ void cross_entropy_kernel(const float* logp, const float* logits, const int32_t* labels,
                                     float* dlogits, float* row_loss, float* row_hit, int n,
                                     int classes) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* lp = logp + static_cast<size_t>(i) * classes;
  const float* z = logits + static_cast<size_t>(i) * classes;
  int label = labels[i];
  label = label < 0 ? 0 : label >= classes ? classes - 1 : label;  // validated when loaded
  int best = 0;
  for (int j = 1; j < classes; ++j)
    if (z[j] > z[best]) best = j;
  if (dlogits) {
    float* d = dlogits + static_cast<size_t>(i) * classes;
    for (int j = 0; j < classes; ++j) d[j] = expf(lp[j]) / n;
    d[label] -= 1.0f / n;
  }
  row_loss[i] = -lp[label];
  row_hit[i] = best == label ? 1.0f : 0.0f;
}

// One block: each thread sums a strided set of rows, then a fixed tree: deterministic.
constexpr int kSumThreads = 256;
__global__ void add_row_sums_kernel(const float* row_loss, const float* row_hit, int n,
                                    float* totals) {
  __shared__ double loss[kSumThreads];
  __shared__ float hits[kSumThreads];
  double l = 0;
  float h = 0;
  for (int i = threadIdx.x; i < n; i += kSumThreads) l += row_loss[i], h += row_hit[i];
  loss[threadIdx.x] = l;
  hits[threadIdx.x] = h;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss[threadIdx.x] += loss[threadIdx.x + half];
      hits[threadIdx.x] += hits[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    totals[0] = static_cast<float>(totals[0] + loss[0]);
    totals[1] += hits[0];
    totals[2] += static_cast<float>(n);
  }
}

}  // namespace

void launch_pad(const float* x, float* out, int nc, int h, int w, int top, int left, int ph, int pw,
                cudaStream_t stream) {
  size_t count = static_cast<size_t>(nc) * ph * pw;
  pad_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, out, nc, h, w, top, left, ph, pw);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_crop(const float* padded, float* x, int nc, int h, int w, int top, int left, int ph,
                 int pw, cudaStream_t stream) {
  size_t count = static_cast<size_t>(nc) * h * w;
  crop_kernel<<<blocks_for(count), kThreads, 0, stream>>>(padded, x, nc, h, w, top, left, ph, pw);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_bias_rows(float* y, const float* b, int n, int out, cudaStream_t stream) {
  size_t count = static_cast<size_t>(n) * out;
  bias_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(y, b, n, out);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_bias_rows_relu(float* y, const float* b, int n, int out, cudaStream_t stream) {
  size_t count = static_cast<size_t>(n) * out;
  bias_rows_relu_kernel<<<blocks_for(count), kThreads, 0, stream>>>(y, b, n, out);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_bias_planes_relu(float* y, const float* b, int n, int k, int plane,
                             cudaStream_t stream) {
  size_t count = static_cast<size_t>(n) * k * plane;
  bias_planes_relu_kernel<<<blocks_for(count), kThreads, 0, stream>>>(y, b, count, k, plane);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_fill(float* x, size_t n, float value, cudaStream_t stream) {
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, value);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_cross_entropy(const float* logp, const float* logits, const int32_t* labels,
                          float* dlogits, float* row_loss, float* row_hit, int n, int classes,
                          float* totals, cudaStream_t stream) {
  cross_entropy_kernel<<<blocks_for(static_cast<size_t>(n)), kThreads, 0, stream>>>(
      logp, logits, labels, dlogits, row_loss, row_hit, n, classes);
  add_row_sums_kernel<<<1, kSumThreads, 0, stream>>>(row_loss, row_hit, n, totals);
  DT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::nn::cuda
