// The GPU probe answers without throwing on any machine, and its summary matches the build.
#include <catch2/catch.hpp>

#include "worker/gpu/gpu_info.h"

using namespace dtrain::gpu;

TEST_CASE("probe_gpu matches how this was built and never throws") {
  GpuInfo info;
  REQUIRE_NOTHROW(info = probe_gpu());
#ifdef DTRAIN_WITH_CUDA
  CHECK(info.compiled);
  CHECK(info.cudnn_version >= 9000);
  CHECK(info.nccl_version >= 20000);
  if (info.device_count == 0) {
    WARN("no GPU: " << describe(info));
    CHECK(describe(info).find("no GPU") != std::string::npos);
  } else {
    CHECK(info.detail.find("kernel check failed") == std::string::npos);
  }
#else
  CHECK_FALSE(info.compiled);
  CHECK(describe(info) == "CPU-only build (DTRAIN_WITH_CUDA=OFF)");
#endif
}
