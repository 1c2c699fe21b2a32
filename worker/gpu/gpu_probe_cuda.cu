// probe_gpu() of the CUDA build: cudaGetDeviceCount, cudnnGetVersion, ncclGetVersion, and one
// kernel launch when a device exists. Errors become text in GpuInfo::detail, never exceptions.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "worker/gpu/gpu_info.h"

namespace dtrain::gpu {
namespace {

__global__ void write_answer(int* out) {
  *out = 42;
}

// Runs write_answer on device 0 and reads it back; "" on success, else what failed.
std::string check_kernel_runs() {
  int* device_value = nullptr;
  cudaError_t rc = cudaMalloc(&device_value, sizeof(int));
  if (rc != cudaSuccess) return std::string("cudaMalloc: ") + cudaGetErrorString(rc);
  write_answer<<<1, 1>>>(device_value);
  int host_value = 0;
  rc = cudaMemcpy(&host_value, device_value, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(device_value);
  if (rc != cudaSuccess) return std::string("kernel launch: ") + cudaGetErrorString(rc);
  if (host_value != 42) return "kernel wrote a wrong value";
  return "";
}

}  // namespace

GpuInfo probe_gpu() {
  GpuInfo info;
  info.compiled = true;
  info.cudnn_version = static_cast<int>(cudnnGetVersion());
  ncclGetVersion(&info.nccl_version);
  cudaRuntimeGetVersion(&info.cuda_runtime_version);
  cudaError_t rc = cudaGetDeviceCount(&info.device_count);
  if (rc != cudaSuccess) {
    info.device_count = 0;
    info.detail = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
    cudaGetLastError();  // clear the sticky error for later callers
    return info;
  }
  if (info.device_count == 0) {
    info.detail = "cudaGetDeviceCount reported 0 devices";
    return info;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  info.detail = prop.name;
  std::string failure = check_kernel_runs();
  if (!failure.empty()) info.detail += " (kernel check failed: " + failure + ")";
  return info;
}

}  // namespace dtrain::gpu
