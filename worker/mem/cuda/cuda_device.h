// The CUDA device's extras that only CUDA sources need: its streams as cudaStream_t. The
// backend, the graph capture and the NCCL communicator use them; everything else sees Device.
#pragma once

#include <cuda_runtime.h>

#include "worker/mem/device.h"

namespace dtrain::nn::cuda {

/// The compute stream of a CUDA device (DT_ENFORCE that device is one).
cudaStream_t compute_stream(Device& device);

}  // namespace dtrain::nn::cuda
