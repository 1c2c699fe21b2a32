// DT_NCCL_CHECK: every NCCL call goes through it; a failure throws IoError (the group restarts)
// naming the call, NCCL's error string, file and line, like DT_CUDA_CHECK in
// worker/mem/cuda/cuda_check.h. It never exits. Include only from sources of the CUDA build (it
// includes nccl.h).
#pragma once

#include <nccl.h>

#include "worker/mem/cuda/cuda_check.h"

#define DT_NCCL_CHECK(call)                                                                       \
  do {                                                                                            \
    ncclResult_t dt_rc_ = (call);                                                                 \
    if (dt_rc_ != ncclSuccess)                                                                    \
      ::dtrain::nn::cuda::throw_vendor_error("NCCL", #call, ncclGetErrorString(dt_rc_), __FILE__, \
                                             __LINE__);                                           \
  } while (false)
