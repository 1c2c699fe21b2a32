// The build-independent half of gpu_info.h.
#include "worker/gpu/gpu_info.h"

#include <fmt/format.h>

namespace dtrain::gpu {

std::string describe(const GpuInfo& info) {
  if (!info.compiled) return "CPU-only build (DTRAIN_WITH_CUDA=OFF)";
  std::string versions =
      fmt::format("CUDA runtime {}, cuDNN {}, NCCL {}", info.cuda_runtime_version,
                  info.cudnn_version, info.nccl_version);
  if (info.device_count == 0)
    return fmt::format("CUDA build ({}), no GPU ({})", versions, info.detail);
  return fmt::format("CUDA build ({}), {} GPU(s), first: {}", versions, info.device_count,
                     info.detail);
}

}  // namespace dtrain::gpu
