// gpu_info.h for the CUDA build. build_versions() only reads compiled-in version numbers (no
// driver call, no context). probe_gpu() is the diagnostic: cudaGetDeviceCount, device 0's name and
// one kernel launch, which creates a context. Errors become text in GpuInfo::detail, never throws.
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

GpuInfo build_versions() {
  GpuInfo info;
  info.compiled = true;
  info.cudnn_version = static_cast<int>(cudnnGetVersion());
  ncclGetVersion(&info.nccl_version);
  cudaRuntimeGetVersion(&info.cuda_runtime_version);  // the library's own number: no driver call
  return info;
}

GpuInfo probe_gpu() {
  GpuInfo info = probe_build();
  int proc_count = info.device_count;
  cudaError_t rc = cudaGetDeviceCount(&info.device_count);
  if (rc != cudaSuccess) {
    info.device_count = 0;
    info.detail = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc) + "; " + info.detail;
    cudaGetLastError();  // clear the sticky error for later callers
    return info;
  }
  if (info.device_count == 0) {
    info.detail = "cudaGetDeviceCount reported 0 devices; " + info.detail;
    return info;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  info.detail = std::string("first: ") + prop.name;
  std::string failure = check_kernel_runs();
  info.detail +=
      failure.empty() ? ", a test kernel ran" : " (kernel check failed: " + failure + ")";
  if (proc_count != info.device_count)
    info.detail += "; /proc/driver/nvidia/gpus counted " + std::to_string(proc_count);
  return info;
}

}  // namespace dtrain::gpu
