// See shm_segment.h. The header is plain data plus two atomics, written once by rank 0 before
// the descriptor leaves its process, so peers read it after the SCM_RIGHTS hand-off without
// further ordering.
#include "worker/comm/shm/shm_segment.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "common/errors.h"

namespace dtrain::comm {
namespace {

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw common::IoError(fmt::format("shared memory: {}: {}", what, std::strerror(errno)));
}

}  // namespace

ShmLayout ShmLayout::for_world(int size, size_t requested_slot_bytes,
                               size_t requested_window_bytes) {
  DT_ENFORCE(size >= 1 && size <= 4096, "shared-memory world of {} ranks", size);
  DT_ENFORCE(requested_slot_bytes >= sizeof(float) && requested_slot_bytes <= (size_t{1} << 32),
             "shared-memory slot of {} bytes", requested_slot_bytes);
  DT_ENFORCE(requested_window_bytes <= (size_t{1} << 36), "shared-memory window of {} bytes",
             requested_window_bytes);
  ShmLayout layout;
  layout.size = size;
  layout.slot_bytes = round_up(requested_slot_bytes, kShmPageBytes);
  layout.window_bytes = round_up(requested_window_bytes, kShmPageBytes);
  layout.control_bytes = round_up(kShmControlsOffset + 64 * size_t(size), kShmPageBytes);
  layout.segment_bytes =
      layout.control_bytes + size_t(size) * (layout.slot_bytes + layout.window_bytes);
  return layout;
}

MappedSegment::MappedSegment(int fd, const ShmLayout& layout) : layout_(layout) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) throw_errno("fstat of the segment");
  if (static_cast<size_t>(info.st_size) != layout.segment_bytes) {
    throw common::IoError(fmt::format("shared memory: segment has {} bytes, expected {}",
                                      info.st_size, layout.segment_bytes));
  }
  void* base = ::mmap(nullptr, layout.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) throw_errno(fmt::format("mmap of {} bytes", layout.segment_bytes));
  base_ = static_cast<uint8_t*>(base);
}

MappedSegment::MappedSegment(MappedSegment&& other) noexcept
    : layout_(other.layout_), base_(std::exchange(other.base_, nullptr)) {}

MappedSegment& MappedSegment::operator=(MappedSegment&& other) noexcept {
  if (this != &other) {
    unmap();
    layout_ = other.layout_;
    base_ = std::exchange(other.base_, nullptr);
  }
  return *this;
}

MappedSegment::~MappedSegment() {
  unmap();
}

void MappedSegment::unmap() noexcept {
  if (base_ != nullptr) ::munmap(base_, layout_.segment_bytes);
  base_ = nullptr;
}

void MappedSegment::init_header() {
  auto* header = new (base_) ShmHeader{};
  header->magic = kShmMagic;
  header->size = static_cast<uint32_t>(layout_.size);
  header->slot_bytes = layout_.slot_bytes;
  header->window_bytes = layout_.window_bytes;
  header->segment_bytes = layout_.segment_bytes;
  for (int r = 0; r < layout_.size; ++r) new (base_ + layout_.control_offset(r)) ShmRankControl{};
}

void MappedSegment::check_header() const {
  const ShmHeader& h = header();
  if (h.magic != kShmMagic || h.size != static_cast<uint32_t>(layout_.size) ||
      h.slot_bytes != layout_.slot_bytes || h.window_bytes != layout_.window_bytes ||
      h.segment_bytes != layout_.segment_bytes) {
    throw common::IoError(fmt::format(
        "shared memory: segment header (magic {:#x}, {} ranks, {}-byte slots, {}-byte windows) "
        "does not match this worker's ({} ranks, {}-byte slots, {}-byte windows)",
        h.magic, h.size, h.slot_bytes, h.window_bytes, layout_.size, layout_.slot_bytes,
        layout_.window_bytes));
  }
}

common::UniqueFd create_segment_fd(size_t bytes) {
  common::UniqueFd fd(::memfd_create("dtrain-shm", MFD_CLOEXEC));
  if (!fd.valid()) throw_errno("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    throw_errno(fmt::format("ftruncate of the segment to {} bytes", bytes));
  return fd;
}

}  // namespace dtrain::comm
