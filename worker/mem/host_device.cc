// The host device: memory from the C++ allocator (64-byte aligned, zero-filled), copies are
// memcpy, and every "enqueue" runs at once, so waits have nothing to wait for. The oneDNN and the
// reference backends both run on it.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "common/errors.h"
#include "worker/mem/device.h"

namespace dtrain::nn {
namespace {

constexpr size_t kAlignment = 64;

void* aligned_zeroed(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* memory = ::operator new(rounded, std::align_val_t(kAlignment), std::nothrow);
  if (!memory) {
    // Out of memory is not a fault a restart cures: dtrain-worker turns bad_alloc into exit 2.
    spdlog::error("host memory: cannot allocate {} bytes", bytes);
    throw std::bad_alloc();
  }
  std::memset(memory, 0, rounded);
  return memory;
}

void aligned_free(void* memory) noexcept {
  ::operator delete(memory, std::align_val_t(kAlignment));
}

class HostDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override { return "host"; }
  void* allocate(size_t bytes) override { return aligned_zeroed(bytes); }
  void release(void* memory) noexcept override { aligned_free(memory); }
  void* allocate_pinned(size_t bytes) override { return aligned_zeroed(bytes); }
  void release_pinned(void* memory) noexcept override { aligned_free(memory); }
  void upload(void* dst, const void* src, size_t bytes) override { move(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { move(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { move(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void synchronize() override {}
  void upload_async(void* dst, const void* pinned_src, size_t bytes) override {
    move(dst, pinned_src, bytes);
  }
  void wait_uploads() override {}
  void wait_upload_sources() override {}
  void download_async(void* pinned_dst, const void* src, size_t bytes) override {
    move(pinned_dst, src, bytes);
  }
  void record_marker(int) override {}
  void wait_marker(int, double) override {}

 private:
  static void move(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
};

}  // namespace

std::unique_ptr<Device> make_host_device() {
  return std::make_unique<HostDevice>();
}

}  // namespace dtrain::nn
