// Where a model's memory lives and where its work runs: the host (oneDNN and the reference
// backend share it) or a CUDA GPU. A device owns allocation, host<->device copies, and its
// streams: a compute stream that every backend call is enqueued on, and a copy stream for input
// batches so their upload overlaps with compute. Buffer<T> is the typed, owning handle to device
// memory. Nothing here knows about layers or collectives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::nn {

enum class DeviceKind { kHost, kCuda };

/// A recorded sequence of a device's compute-stream work (a CUDA graph), replayed as one launch.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  /// Enqueues the whole recorded work on the compute stream.
  virtual void launch() = 0;
};

/// All calls come from one thread (the trainer's), except where noted. On the host device every
/// "enqueue" runs at once and every wait returns at once.
class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  /// Zero-filled device memory of bytes (> 0 bytes is always allocated, even for 0). Throws
  /// std::bad_alloc when the device is out of memory (dtrain-worker: exit 2), IoError for other
  /// device failures. Release with release().
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* memory) noexcept = 0;
  /// Page-locked host memory (plain host memory on the host device), zero-filled.
  virtual void* allocate_pinned(size_t bytes) = 0;
  virtual void release_pinned(void* memory) noexcept = 0;

  /// Enqueues a copy of host memory to the device on the compute stream. src is read when the
  /// copy runs: it must be pinned memory that stays valid (or a host device).
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  /// Waits for the work enqueued so far, then copies device memory to the host.
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  /// Enqueues a device-to-device copy on the compute stream.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  /// Enqueues dst = 0 on the compute stream.
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  /// Blocks until every enqueued copy and computation has run.
  virtual void synchronize() = 0;

  /// Enqueues a copy from pinned host memory on the copy stream, after the compute stream's work
  /// enqueued so far (so a buffer the last step read is not overwritten early). Compute work
  /// enqueued after wait_uploads() sees it.
  virtual void upload_async(void* dst, const void* pinned_src, size_t bytes) = 0;
  /// Makes the compute stream's next work wait for every upload_async() so far.
  virtual void wait_uploads() = 0;
  /// Blocks the host until the copy stream's uploads so far have read their sources, so the
  /// pinned memory may be refilled.
  virtual void wait_upload_sources() = 0;

  /// Enqueues a copy of device memory into pinned host memory on the compute stream; the host
  /// may read it after wait_marker() of a marker recorded later.
  virtual void download_async(void* pinned_dst, const void* src, size_t bytes) = 0;
  /// Records marker slot (0 <= slot < kMarkers) after the compute stream's work so far.
  virtual void record_marker(int slot) = 0;
  /// Blocks the host until the work before marker slot's last record has run. Throws IoError
  /// naming what it waited for after timeout_seconds (a stuck collective: a peer is gone).
  virtual void wait_marker(int slot, double timeout_seconds) = 0;
  static constexpr int kMarkers = 4;

  /// Starts recording the compute stream's work into a graph instead of running it. Returns
  /// false when this device cannot (the host device: its work runs at once).
  virtual bool begin_capture() { return false; }
  /// Ends the recording begun by begin_capture() and returns the replayable graph.
  virtual std::unique_ptr<DeviceGraph> end_capture() { return nullptr; }

  /// Where this device is, unique on its host ("" for the host device; a GPU's PCI bus id), so
  /// workers can tell whether they share a GPU.
  virtual std::string location() const { return ""; }

  /// The compute stream (cudaStream_t) for libraries that enqueue on it (NCCL); null on the host.
  virtual void* native_stream() { return nullptr; }
};

/// The host device: memory from operator new, copies are memcpy.
std::unique_ptr<Device> make_host_device();
/// The CUDA device for the current GPU (cuda/cuda_device.cu). ConfigError in a CPU-only build.
std::unique_ptr<Device> make_cuda_device();

/// Where a DeviceMemory lives: the device's own memory or its pinned host memory.
enum class MemoryKind { kDevice, kPinnedHost };

/// Owning, move-only handle to count elements of T in a device's memory of the given kind. The
/// device must outlive it. Releasing waits for the device's work that may still use it.
template <class T, MemoryKind Kind>
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(Device& device, size_t count)
      : device_(&device),
        data_(static_cast<T*>(allocate(device, count * sizeof(T)))),
        count_(count) {}
  /// count elements at lent, memory of the device that someone else owns and keeps alive (a
  /// communicator's shared window on the host device); never released here.
  DeviceMemory(Device& device, T* lent, size_t count)
      : device_(&device), data_(lent), count_(count), owned_(false) {}
  DeviceMemory(DeviceMemory&& other) noexcept { swap(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    DeviceMemory(std::move(other)).swap(*this);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (!data_ || !owned_) return;
    if (Kind == MemoryKind::kDevice) {
      device_->release(data_);
    } else {
      device_->release_pinned(data_);
    }
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  Device* device() const { return device_; }
  void swap(DeviceMemory& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    std::swap(owned_, other.owned_);
  }
  bool owned() const { return owned_; }

 protected:
  static void* allocate(Device& device, size_t bytes) {
    return Kind == MemoryKind::kDevice ? device.allocate(bytes) : device.allocate_pinned(bytes);
  }
  Device* device_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
  bool owned_ = true;
};

/// Pinned host memory of a device (for input batches and small read-backs).
template <class T>
using PinnedBuffer = DeviceMemory<T, MemoryKind::kPinnedHost>;

/// count elements of T in the device's memory, with copies to and from the host.
template <class T>
class Buffer : public DeviceMemory<T, MemoryKind::kDevice> {
 public:
  using DeviceMemory<T, MemoryKind::kDevice>::DeviceMemory;

  /// A host copy of elements [offset, offset + count); waits for the device's work.
  std::vector<T> to_host(size_t offset = 0, size_t count = SIZE_MAX) const {
    count = std::min(count, this->count_ - offset);
    std::vector<T> host(count);
    if (count) this->device_->download(host.data(), this->data_ + offset, count * sizeof(T));
    return host;
  }
  /// Copies host values into elements [offset, offset + host.size()) and waits until done.
  void from_host(const std::vector<T>& host, size_t offset = 0) {
    from_host(host.data(), host.size(), offset);
  }
  void from_host(const T* host, size_t count, size_t offset = 0);
};

template <class T>
void Buffer<T>::from_host(const T* host, size_t count, size_t offset) {
  if (count == 0) return;
  if (this->device_->kind() == DeviceKind::kHost) {
    this->device_->upload(this->data_ + offset, host, count * sizeof(T));
    return;
  }
  PinnedBuffer<T> staging(*this->device_, count);
  std::copy(host, host + count, staging.data());
  this->device_->upload(this->data_ + offset, staging.data(), count * sizeof(T));
  this->device_->synchronize();
}

}  // namespace dtrain::nn
