// The GPU probes answer without throwing on any machine and match how this was built; the
// context-free ones follow CUDA_VISIBLE_DEVICES and, on a GPU machine, leave device 0 without a
// CUDA context (asked of the driver directly), while probe_gpu() makes one. Without a GPU the
// context checks are skipped with a warning.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "common/gpu_count.h"
#include "worker/gpu/gpu_info.h"

#ifdef DTRAIN_WITH_CUDA
#include <cuda.h>
#include <dlfcn.h>
#endif

using namespace dtrain::gpu;

namespace {

// Whether device 0's primary context (the one the CUDA runtime uses) is active, asked of libcuda
// through dlopen so the test links no driver; nullopt without a CUDA build, driver or device.
std::optional<bool> primary_context_active() {
#ifdef DTRAIN_WITH_CUDA
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return std::nullopt;
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(::dlsym(lib, "cuInit"));
  auto device_get = reinterpret_cast<CUresult (*)(CUdevice*, int)>(::dlsym(lib, "cuDeviceGet"));
  auto state = reinterpret_cast<CUresult (*)(CUdevice, unsigned*, int*)>(
      ::dlsym(lib, "cuDevicePrimaryCtxGetState"));
  CUdevice device = 0;
  unsigned flags = 0;
  int active = 0;
  if (!init || !device_get || !state || init(0) != CUDA_SUCCESS ||
      device_get(&device, 0) != CUDA_SUCCESS || state(device, &flags, &active) != CUDA_SUCCESS)
    return std::nullopt;
  return active != 0;
#else
  return std::nullopt;
#endif
}

// Sets CUDA_VISIBLE_DEVICES (nullopt: unsets it) until the end of the scope.
class ScopedCudaDevices {
 public:
  explicit ScopedCudaDevices(const std::optional<std::string>& value) {
    if (const char* old = ::getenv("CUDA_VISIBLE_DEVICES")) old_ = old;
    set(value);
  }
  ~ScopedCudaDevices() { set(old_); }

 private:
  static void set(const std::optional<std::string>& value) {
    if (value)
      ::setenv("CUDA_VISIBLE_DEVICES", value->c_str(), 1);
    else
      ::unsetenv("CUDA_VISIBLE_DEVICES");
  }
  std::optional<std::string> old_;
};

}  // namespace

// First in the file: a later test case's probe_gpu() makes a context for the rest of the process.
TEST_CASE("probe_build and visible_gpu_count create no CUDA context") {
  std::optional<bool> before = primary_context_active();
  if (!before) {
    WARN("no CUDA driver or device here: context check skipped");
  } else if (*before) {
    WARN("a CUDA context existed before the check: skipped");
  } else {
    GpuInfo info = probe_build();
    CHECK(visible_gpu_count() == info.device_count);
    CHECK(primary_context_active() == false);
  }
}

TEST_CASE("probe_build matches how this was built and follows CUDA_VISIBLE_DEVICES") {
  int on_host = dtrain::common::count_driver_gpus();
  {
    ScopedCudaDevices unset(std::nullopt);
    CHECK(visible_gpu_count() == on_host);
    GpuInfo info;
    REQUIRE_NOTHROW(info = probe_build());
#ifdef DTRAIN_WITH_CUDA
    CHECK(info.compiled);
    CHECK(info.cudnn_version >= 9000);
    CHECK(info.nccl_version >= 20000);
    CHECK(info.cuda_runtime_version >= 12000);
    CHECK(info.device_count == on_host);
    CHECK(describe(info).rfind("CUDA build (CUDA runtime ", 0) == 0);
    if (on_host == 0) CHECK(describe(info).find("no GPU") != std::string::npos);
#else
    CHECK_FALSE(info.compiled);
    CHECK(info.device_count == 0);
    CHECK(describe(info) == "CPU-only build (DTRAIN_WITH_CUDA=OFF)");
#endif
  }
  ScopedCudaDevices hidden("-1");
  CHECK(visible_gpu_count() == 0);
  CHECK(probe_build().device_count == 0);
  if (on_host > 0) CHECK(probe_build().detail.find("hides all") != std::string::npos);
}

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
    INFO(describe(info));
    CHECK(info.detail.find("kernel check failed") == std::string::npos);
    CHECK(visible_gpu_count() == info.device_count);  // the /proc count agrees with CUDA's
    CHECK(primary_context_active() == true);          // so the context check above can fail
  }
#else
  CHECK_FALSE(info.compiled);
  CHECK(describe(info) == "CPU-only build (DTRAIN_WITH_CUDA=OFF)");
#endif
}
