// probe_gpu() of the CPU-only build: nothing compiled in.
#include "worker/gpu/gpu_info.h"

namespace dtrain::gpu {

GpuInfo probe_gpu() {
  GpuInfo info;
  info.detail = "built without CUDA";
  return info;
}

}  // namespace dtrain::gpu
