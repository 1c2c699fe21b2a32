// gpu_info.h for the CPU-only build: no versions, no device calls. probe_gpu() has nothing more to
// check than probe_build() has, so it returns just that.
#include "worker/gpu/gpu_info.h"

namespace dtrain::gpu {

GpuInfo build_versions() {
  return {};
}

GpuInfo probe_gpu() {
  return probe_build();
}

}  // namespace dtrain::gpu
