// See precision_kernels.h. One thread per value.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "worker/mem/cuda/cuda_check.h"
#include "worker/nn/cuda/precision_kernels.h"

namespace dtrain::nn::cuda {
namespace {

constexpr int kThreads = 256;
int blocks_for(size_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}

template <class T>
__device__ T narrow(float x);
template <>
__device__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __half narrow<__half>(float x) {
  return __float2half_rn(x);
}
__device__ float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ float widen(__half x) {
  return __half2float(x);
}

template <class T>
__global__ void to_half_kernel(const float* x, T* out, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = narrow<T>(x[i]);
}

template <class T>
__global__ void from_half_kernel(const T* x, float* out, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = widen(x[i]);
}

template <class T>
__global__ void conv_epilogue_kernel(const T* y16, const float* b, float* y, size_t count, int k,
                                     int plane, bool relu) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float v = widen(y16[i]) + b[(i / plane) % k];
  y[i] = relu ? fmaxf(v, 0.0f) : v;
}

}  // namespace

void launch_to_half(const float* x, void* out, size_t n, Half half, cudaStream_t stream) {
  if (half == Half::kBfloat16)
    to_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(out), n);
  else
    to_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, static_cast<__half*>(out), n);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_from_half(const void* x, float* out, size_t n, Half half, cudaStream_t stream) {
  if (half == Half::kBfloat16)
    from_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                             out, n);
  else
    from_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const __half*>(x), out, n);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_conv_epilogue(const void* y16, const float* b, float* y, int n, int k, int plane,
                          bool relu, Half half, cudaStream_t stream) {
  size_t count = static_cast<size_t>(n) * k * plane;
  if (half == Half::kBfloat16)
    conv_epilogue_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(y16), b, y, count, k, plane, relu);
  else
    conv_epilogue_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
        static_cast<const __half*>(y16), b, y, count, k, plane, relu);
  DT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::nn::cuda
