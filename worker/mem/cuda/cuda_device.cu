// The CUDA device: cudaMalloc'd memory (zeroed), cudaHostAlloc'd pinned memory, a compute stream
// that every backend call is enqueued on and a copy stream for input batches, ordered by events.
// Downloads wait for the compute stream. It does not pick the GPU: CUDA_VISIBLE_DEVICES does
// (the launcher gives each worker its own), and this uses the first visible one.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "worker/mem/cuda/cuda_device.h"
#include "worker/mem/cuda/cuda_handles.h"

namespace dtrain::nn {
namespace {

class CudaDevice final : public Device {
 public:
  CudaDevice() {
    int count = 0;
    DT_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (count == 0) throw common::ConfigError("device \"cuda\": no GPU is visible");
    DT_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop{};
    DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    name_ = prop.name;
    char bus[64] = {};
    DT_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    location_ = bus;
    compute_ = cuda::make_stream();
    copy_ = cuda::make_stream();
    compute_done_ = cuda::make_event();
    uploads_done_ = cuda::make_event();
  }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  std::string location() const override { return location_; }

  void* allocate(size_t bytes) override {
    void* memory = nullptr;
    cudaError_t rc = cudaMalloc(&memory, std::max<size_t>(bytes, 1));
    if (rc == cudaErrorMemoryAllocation) {
      // As on the host: a restart would not fit either; dtrain-worker makes it exit 2.
      cudaGetLastError();
      spdlog::error("GPU {}: cannot allocate {} bytes: out of memory", name_, bytes);
      throw std::bad_alloc();
    }
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw common::IoError(fmt::format("GPU {}: cannot allocate {} bytes: {}", name_, bytes,
                                        cudaGetErrorString(rc)));
    }
    DT_CUDA_CHECK(cudaMemsetAsync(memory, 0, std::max<size_t>(bytes, 1), compute_.get()));
    return memory;
  }
  void release(void* memory) noexcept override {
    cudaStreamSynchronize(compute_.get());  // nothing enqueued may still use it
    cudaFree(memory);
  }
  void* allocate_pinned(size_t bytes) override {
    void* memory = nullptr;
    cudaError_t rc = cudaHostAlloc(&memory, std::max<size_t>(bytes, 1), cudaHostAllocDefault);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw common::IoError(fmt::format("cannot allocate {} bytes of pinned host memory: {}", bytes,
                                        cudaGetErrorString(rc)));
    }
    std::memset(memory, 0, std::max<size_t>(bytes, 1));
    return memory;
  }
  void release_pinned(void* memory) noexcept override {
    cudaStreamSynchronize(compute_.get());
    cudaStreamSynchronize(copy_.get());
    cudaFreeHost(memory);
  }

  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes)
      DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_.get()));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_.get()));
    DT_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src)
      DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_.get()));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) DT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, compute_.get()));
  }
  void synchronize() override {
    DT_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    DT_CUDA_CHECK(cudaStreamSynchronize(copy_.get()));
  }

  void upload_async(void* dst, const void* pinned_src, size_t bytes) override {
    // Not before the compute work that may still read dst (the step before last's input).
    DT_CUDA_CHECK(cudaEventRecord(compute_done_.get(), compute_.get()));
    DT_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), compute_done_.get(), 0));
    if (bytes)
      DT_CUDA_CHECK(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, copy_.get()));
  }
  void wait_uploads() override {
    DT_CUDA_CHECK(cudaEventRecord(uploads_done_.get(), copy_.get()));
    DT_CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), uploads_done_.get(), 0));
  }
  void wait_upload_sources() override { DT_CUDA_CHECK(cudaStreamSynchronize(copy_.get())); }

  void download_async(void* pinned_dst, const void* src, size_t bytes) override {
    if (bytes)
      DT_CUDA_CHECK(
          cudaMemcpyAsync(pinned_dst, src, bytes, cudaMemcpyDeviceToHost, compute_.get()));
  }
  void record_marker(int slot) override {
    DT_CUDA_CHECK(cudaEventRecord(markers_.at(static_cast<size_t>(slot)).get(), compute_.get()));
  }
  void wait_marker(int slot, double timeout_seconds) override {
    cudaEvent_t event = markers_.at(static_cast<size_t>(slot)).get();
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
    auto pause = std::chrono::microseconds(5);
    for (;;) {
      cudaError_t rc = cudaEventQuery(event);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) DT_CUDA_CHECK(rc);
      if (std::chrono::steady_clock::now() > deadline) {
        throw common::IoError(fmt::format(
            "GPU {}: a training step did not finish within {:.0f} s (a collective may be waiting "
            "for a peer that is gone)",
            name_, timeout_seconds));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  bool begin_capture() override {
    DT_CUDA_CHECK(cudaStreamBeginCapture(compute_.get(), cudaStreamCaptureModeThreadLocal));
    return true;
  }
  std::unique_ptr<DeviceGraph> end_capture() override;

  void* native_stream() override { return compute_.get(); }

 private:
  std::string name_, location_;
  cuda::StreamHandle compute_, copy_;
  cuda::EventHandle compute_done_, uploads_done_;
  std::vector<cuda::EventHandle> markers_ = make_markers();

  static std::vector<cuda::EventHandle> make_markers() {
    std::vector<cuda::EventHandle> markers;
    for (int i = 0; i < kMarkers; ++i) markers.push_back(cuda::make_event());
    return markers;
  }
};

class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cuda::GraphHandle graph, cuda::GraphExecHandle exec, cudaStream_t stream)
      : graph_(std::move(graph)), exec_(std::move(exec)), stream_(stream) {}
  void launch() override { DT_CUDA_CHECK(cudaGraphLaunch(exec_.get(), stream_)); }

 private:
  cuda::GraphHandle graph_;
  cuda::GraphExecHandle exec_;
  cudaStream_t stream_;
};

std::unique_ptr<DeviceGraph> CudaDevice::end_capture() {
  cudaGraph_t raw = nullptr;
  DT_CUDA_CHECK(cudaStreamEndCapture(compute_.get(), &raw));
  cuda::GraphHandle graph(raw);
  cudaGraphExec_t exec = nullptr;
  DT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
  return std::make_unique<CudaGraph>(std::move(graph), cuda::GraphExecHandle(exec), compute_.get());
}

}  // namespace

std::unique_ptr<Device> make_cuda_device() {
  return std::make_unique<CudaDevice>();
}

namespace cuda {
cudaStream_t compute_stream(Device& device) {
  DT_ENFORCE(device.kind() == DeviceKind::kCuda, "a CUDA stream of the {} device", device.name());
  return static_cast<cudaStream_t>(device.native_stream());
}
}  // namespace cuda

}  // namespace dtrain::nn
