// DT_CUDA_CHECK, DT_CUDNN_CHECK, DT_CUBLAS_CHECK (DT_NCCL_CHECK: comm/nccl/nccl_check.h): every
// vendor call goes through one of these; a failure throws IoError (the group restarts) naming the
// call, file and line. They never exit. Include only from CUDA sources.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

namespace dtrain::nn::cuda {
[[noreturn]] void throw_vendor_error(const char* library, const char* call, const std::string& what,
                                     const char* file, int line);
}  // namespace dtrain::nn::cuda

#define DT_CUDA_CHECK(call)                                                                       \
  do {                                                                                            \
    cudaError_t dt_rc_ = (call);                                                                  \
    if (dt_rc_ != cudaSuccess)                                                                    \
      ::dtrain::nn::cuda::throw_vendor_error("CUDA", #call, cudaGetErrorString(dt_rc_), __FILE__, \
                                             __LINE__);                                           \
  } while (false)

#define DT_CUDNN_CHECK(call)                                                              \
  do {                                                                                    \
    cudnnStatus_t dt_rc_ = (call);                                                        \
    if (dt_rc_ != CUDNN_STATUS_SUCCESS)                                                   \
      ::dtrain::nn::cuda::throw_vendor_error("cuDNN", #call, cudnnGetErrorString(dt_rc_), \
                                             __FILE__, __LINE__);                         \
  } while (false)

#define DT_CUBLAS_CHECK(call)                                                             \
  do {                                                                                    \
    cublasStatus_t dt_rc_ = (call);                                                       \
    if (dt_rc_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::dtrain::nn::cuda::throw_vendor_error(                                             \
          "cuBLAS", #call, std::to_string(static_cast<int>(dt_rc_)), __FILE__, __LINE__); \
  } while (false)
