// Layout of ShmCommunicator's shared segment and the memfd + mmap that hold it. Only memory:
// no sockets, waiting or collectives here. Nothing is created in /dev/shm or on disk, so the
// segment dies with the last process that maps it or holds its descriptor.
//
// Segment (one memfd, every offset a multiple of 4096 except inside the control page):
//   [0, 2048)                    ShmHeader: magic, world size, slot size, first failure
//   [2048 + 64 r, +64)           ShmRankControl of rank r: phase counter (futex word), sleepers
//   [control_bytes + r * slot_bytes, +slot_bytes)  slot of rank r: written only by rank r
//   [windows_offset + r * window_bytes, +window_bytes)  window of rank r: memory rank r's caller
//                                 keeps its data in (see ShmCommunicator::window); may be empty
// control_bytes = 2048 + 64 * size rounded up to a page; slot_bytes and window_bytes rounded up
// to a page. Pages of a memfd are allocated when first written, so a large window costs address
// space, not memory, until it is used.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/unique_fd.h"

namespace dtrain::comm {

inline constexpr uint64_t kShmMagic = 0x64747261696e5348ull;  // "dtrainSH"
inline constexpr size_t kShmPageBytes = 4096;
inline constexpr size_t kShmControlsOffset = 2048;
inline constexpr size_t kShmAbortMessageBytes = 1024;

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex words are 32 bits");

/// One rank's control line, 64 bytes so no two ranks' words share a cache line.
struct alignas(64) ShmRankControl {
  /// Phases this rank has published (wraps around); peers FUTEX_WAIT on it.
  std::atomic<uint32_t> phase;
  /// Peers asleep, or about to sleep, on phase: the publisher wakes them only when non-zero.
  std::atomic<uint32_t> sleepers;
  /// What this rank's current collective is, written before its first publish and read by
  /// peers after they saw it, so ranks that disagree fail instead of mixing up data.
  std::atomic<uint32_t> call_kind;
  std::atomic<uint64_t> call_count;   ///< floats (all-reduce) or bytes
  std::atomic<uint64_t> call_offset;  ///< floats into the window (window all-reduce)
};

/// The start of the control page; written by rank 0 before any peer maps the segment.
struct ShmHeader {
  uint64_t magic;
  uint32_t size;
  uint32_t reserved;
  uint64_t slot_bytes;
  uint64_t window_bytes;
  uint64_t segment_bytes;
  /// rank + 1 of the first rank to post a failure (its own abort, or a peer it saw die); 0: none
  std::atomic<uint32_t> abort_claim;
  std::atomic<uint32_t> aborted_by;  ///< rank + 1 once that rank's message is complete
  /// The failure, naming the failed rank ("worker:1 (rank 1) aborted: ..."); NUL-terminated,
  /// valid once aborted_by != 0.
  char abort_message[kShmAbortMessageBytes];
};

static_assert(sizeof(ShmHeader) <= kShmControlsOffset, "header overlaps the rank controls");

/// Sizes and offsets of the segment for a world of size ranks.
struct ShmLayout {
  int size = 1;
  size_t slot_bytes = 0;     ///< per rank, a multiple of the page size
  size_t window_bytes = 0;   ///< per rank, a multiple of the page size (0: no windows)
  size_t control_bytes = 0;  ///< header and rank controls, a multiple of the page size
  size_t segment_bytes = 0;  ///< control_bytes + size * (slot_bytes + window_bytes)

  /// Throws EnforceError for a size below 1 or a segment too large to address.
  static ShmLayout for_world(int size, size_t requested_slot_bytes,
                             size_t requested_window_bytes = 0);
  size_t control_offset(int rank) const { return kShmControlsOffset + 64 * size_t(rank); }
  size_t slot_offset(int rank) const { return control_bytes + size_t(rank) * slot_bytes; }
  size_t window_offset(int rank) const {
    return control_bytes + size_t(size) * slot_bytes + size_t(rank) * window_bytes;
  }
};

/// A shared read-write mapping of a whole segment; move-only, unmapped by the destructor.
class MappedSegment {
 public:
  MappedSegment() = default;
  /// Maps layout.segment_bytes of fd. Throws IoError naming the failed call.
  MappedSegment(int fd, const ShmLayout& layout);
  MappedSegment(MappedSegment&& other) noexcept;
  MappedSegment& operator=(MappedSegment&& other) noexcept;
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;
  ~MappedSegment();

  const ShmLayout& layout() const { return layout_; }
  ShmHeader& header() const { return *reinterpret_cast<ShmHeader*>(base_); }
  ShmRankControl& control(int rank) const {
    return *reinterpret_cast<ShmRankControl*>(base_ + layout_.control_offset(rank));
  }
  uint8_t* slot(int rank) const { return base_ + layout_.slot_offset(rank); }
  uint8_t* window(int rank) const { return base_ + layout_.window_offset(rank); }

  /// Rank 0, before sharing the segment: writes the header (the memfd starts zero-filled).
  void init_header();
  /// A peer after mapping: throws IoError unless the header matches this layout.
  void check_header() const;

 private:
  void unmap() noexcept;

  ShmLayout layout_;
  uint8_t* base_ = nullptr;
};

/// A new anonymous memfd (MFD_CLOEXEC) of bytes bytes, zero-filled. Throws IoError.
common::UniqueFd create_segment_fd(size_t bytes);

}  // namespace dtrain::comm
