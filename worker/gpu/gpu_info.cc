// The build-independent half of gpu_info.h: the /proc count, probe_build() and describe(). The
// CUDA calls live in gpu_probe_cuda.cu; nothing here touches CUDA, so nothing here makes a context.
#include "worker/gpu/gpu_info.h"

#include <fmt/format.h>

#include <optional>

#include "common/env_vars.h"
#include "common/gpu_count.h"

namespace dtrain::gpu {

int visible_gpu_count() {
  return common::count_visible_gpus(common::get_env(common::kEnvCudaDevices));
}

GpuInfo probe_build() {
  GpuInfo info = build_versions();
  std::optional<std::string> mask = common::get_env(common::kEnvCudaDevices);
  int on_host = common::count_driver_gpus();
  int visible = common::count_visible_gpus(mask);
  std::string seen;
  if (on_host == 0)
    seen = "no GPU listed in /proc/driver/nvidia/gpus";
  else if (visible == 0)
    seen =
        fmt::format("CUDA_VISIBLE_DEVICES=\"{}\" hides all {} GPU(s)", mask.value_or(""), on_host);
  else
    seen = fmt::format("{} of {} listed in /proc/driver/nvidia/gpus; not opened", visible, on_host);
  if (!info.compiled) {
    info.detail = "built without CUDA; " + seen;
    return info;
  }
  info.device_count = visible;
  info.detail = seen;
  return info;
}

std::string describe(const GpuInfo& info) {
  if (!info.compiled) return "CPU-only build (DTRAIN_WITH_CUDA=OFF)";
  std::string versions =
      fmt::format("CUDA runtime {}, cuDNN {}, NCCL {}", info.cuda_runtime_version,
                  info.cudnn_version, info.nccl_version);
  if (info.device_count == 0)
    return fmt::format("CUDA build ({}), no GPU ({})", versions, info.detail);
  return fmt::format("CUDA build ({}), {} GPU(s) ({})", versions, info.device_count, info.detail);
}

}  // namespace dtrain::gpu
