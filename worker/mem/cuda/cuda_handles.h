// Move-only RAII owners for CUDA, cuDNN and cuBLAS handles: each is created by a constructor that
// throws through DT_*_CHECK and destroyed by a destructor that never throws, so a later create
// that fails cannot leak an earlier one. Include only from CUDA sources.
#pragma once

#include <utility>

#include "worker/mem/cuda/cuda_check.h"

namespace dtrain::nn::cuda {

/// Owns one handle of type T, destroyed with Destroy (a function returning a status).
template <class T, auto Destroy>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(T value) : value_(value), owned_(true) {}
  UniqueHandle(UniqueHandle&& other) noexcept
      : value_(std::exchange(other.value_, T{})), owned_(std::exchange(other.owned_, false)) {}
  UniqueHandle& operator=(UniqueHandle&& other) noexcept {
    UniqueHandle(std::move(other)).swap(*this);
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() {
    if (owned_) (void)Destroy(value_);
  }
  T get() const { return value_; }
  void swap(UniqueHandle& other) noexcept {
    std::swap(value_, other.value_);
    std::swap(owned_, other.owned_);
  }

 private:
  T value_{};
  bool owned_ = false;
};

using StreamHandle = UniqueHandle<cudaStream_t, cudaStreamDestroy>;
using EventHandle = UniqueHandle<cudaEvent_t, cudaEventDestroy>;
using GraphHandle = UniqueHandle<cudaGraph_t, cudaGraphDestroy>;
using GraphExecHandle = UniqueHandle<cudaGraphExec_t, cudaGraphExecDestroy>;
using CudnnHandle = UniqueHandle<cudnnHandle_t, cudnnDestroy>;
using CublasHandle = UniqueHandle<cublasHandle_t, cublasDestroy>;
using TensorDescriptor = UniqueHandle<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = UniqueHandle<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    UniqueHandle<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;
using PoolingDescriptor = UniqueHandle<cudnnPoolingDescriptor_t, cudnnDestroyPoolingDescriptor>;
using ActivationDescriptor =
    UniqueHandle<cudnnActivationDescriptor_t, cudnnDestroyActivationDescriptor>;

/// A non-blocking stream.
inline StreamHandle make_stream() {
  cudaStream_t s{};
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return StreamHandle(s);
}
/// An event without timing (cheapest to record and wait on).
inline EventHandle make_event() {
  cudaEvent_t e{};
  DT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return EventHandle(e);
}

}  // namespace dtrain::nn::cuda
