// make_cuda_backend() of the CPU-only build (make_cuda_device(): worker/mem/cuda).
#include "common/errors.h"
#include "worker/nn/backend.h"

namespace dtrain::nn {

std::unique_ptr<Backend> make_cuda_backend(MathMode) {
  throw common::ConfigError("this dtrain-worker was built without CUDA (DTRAIN_WITH_CUDA=OFF)");
}

}  // namespace dtrain::nn
