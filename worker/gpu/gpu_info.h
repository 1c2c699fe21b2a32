// What the GPU side of this build can see, at two depths. visible_gpu_count() and probe_build()
// read compiled-in versions and the NVIDIA driver's /proc files: they never create a CUDA context,
// so any process may call them. probe_gpu() is the diagnostic behind `dtrain-worker --gpu-info`:
// it opens device 0 and runs a kernel, which creates a context; call it only when a person asks,
// or in a process that trains on the GPU anyway. None of them throws: "no GPU" is an answer.
#pragma once

#include <string>

namespace dtrain::gpu {

struct GpuInfo {
  bool compiled = false;  ///< built with DTRAIN_WITH_CUDA
  int device_count = 0;   ///< GPUs this build can use here; 0 without a GPU, driver or CUDA build
  int cuda_runtime_version = 0;
  int cudnn_version = 0;
  int nccl_version = 0;
  std::string detail;  ///< why device_count is 0, or what was seen of the GPUs
};

/// GPUs visible to this process: the driver's /proc/driver/nvidia/gpus count, limited by this
/// process's CUDA_VISIBLE_DEVICES. Counts in a CPU-only build too. No CUDA call, no context; it
/// lists one folder and cannot block.
int visible_gpu_count();

/// The build's versions and device_count = visible_gpu_count() (0 in a CPU-only build), without
/// creating a CUDA context or initialising the driver. For logs and "is a GPU here?" decisions.
GpuInfo probe_build();

/// probe_build(), then the CUDA runtime's own view: cudaGetDeviceCount, device 0's name, and one
/// tiny kernel to prove the device works. Creates a CUDA context on device 0 when there is one,
/// for the life of the process. Blocks as long as the driver takes to initialise (seconds).
GpuInfo probe_gpu();

/// The compiled-in half of probe_build(), one definition per build (gpu_probe_cuda.cu,
/// gpu_probe_none.cc): compiled and the three versions; device_count 0. No device call.
GpuInfo build_versions();

/// One line for logs: "CUDA build (CUDA runtime 12080, cuDNN 90800, NCCL 22105), no GPU (...)"
/// or "..., 2 GPU(s) (detail)"; "CPU-only build (DTRAIN_WITH_CUDA=OFF)" without CUDA.
std::string describe(const GpuInfo& info);

}  // namespace dtrain::gpu
