// make_cuda_backend() of the CPU-only build.
#include "common/errors.h"
#include "worker/nn/backend.h"
#include "worker/nn/device.h"

namespace dtrain::nn {

std::unique_ptr<Backend> make_cuda_backend() {
  throw common::ConfigError("this dtrain-worker was built without CUDA (DTRAIN_WITH_CUDA=OFF)");
}

}  // namespace dtrain::nn

namespace dtrain::nn {

std::unique_ptr<Device> make_cuda_device() {
  throw common::ConfigError("this dtrain-worker was built without CUDA (DTRAIN_WITH_CUDA=OFF)");
}

}  // namespace dtrain::nn
