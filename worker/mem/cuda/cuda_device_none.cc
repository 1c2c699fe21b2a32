// make_cuda_device() of the CPU-only build.
#include "common/errors.h"
#include "worker/mem/device.h"

namespace dtrain::nn {

std::unique_ptr<Device> make_cuda_device() {
  throw common::ConfigError("this dtrain-worker was built without CUDA (DTRAIN_WITH_CUDA=OFF)");
}

}  // namespace dtrain::nn
