// What the CUDA side of this build can see: whether it was compiled in, how many GPUs the driver
// reports, and the cuDNN/NCCL versions. Never throws: "no GPU" is an answer, not an error.
#pragma once

#include <string>

namespace dtrain::gpu {

struct GpuInfo {
  bool compiled = false;  ///< built with DTRAIN_WITH_CUDA
  int device_count = 0;   ///< 0 when there is no GPU or no driver
  int cuda_runtime_version = 0;
  int cudnn_version = 0;
  int nccl_version = 0;
  std::string detail;  ///< why device_count is 0, or the first device's name
};

/// Asks the CUDA runtime, cuDNN and NCCL. On a GPU it also runs one tiny kernel to prove the
/// device works. Blocks for as long as the driver takes to initialise (seconds at most).
GpuInfo probe_gpu();

/// One line for logs: "CUDA build, no GPU (cudaGetDeviceCount: no CUDA-capable device ...)".
std::string describe(const GpuInfo& info);

}  // namespace dtrain::gpu
