// Reads one IDX file (the MNIST / Fashion-MNIST format), raw or gzip-compressed, and checks it:
// magic, dimensions, and that the data is exactly as long as the header says. Only the two
// kinds dtrain trains on (uint8 images N x H x W, uint8 labels N); no other IDX types, no
// writing, no scaling (dataset.h turns bytes into floats).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

enum class IdxKind {
  kImages,  ///< magic 0x00000803: uint8, 3 dimensions (count, height, width)
  kLabels,  ///< magic 0x00000801: uint8, 1 dimension (count)
};

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;
/// Largest file (after decompression) we read; a header asking for more is refused.
inline constexpr uint64_t kMaxIdxBytes = uint64_t{4} << 30;

/// The checked contents of one IDX file.
struct IdxArray {
  std::vector<int64_t> dims;  ///< from the header; dims[0] is the count
  std::vector<uint8_t> data;  ///< exactly the product of dims bytes, row-major
};

/// Reads and checks path as kind. Gzip is recognised by its magic bytes (1f 8b), not the name;
/// its decompressed contents come from, or go to, the cache of idx_cache.h.
/// The header is checked before the data is read, and no more data is read or inflated than the
/// header promises (a gzip bomb with a bad header costs a few KB); FIFOs, devices and folders are
/// refused. Every problem is a common::ConfigError "<path>: <what is wrong>" (missing file, not a
/// regular file, bad gzip, bad magic, zero dimension, truncated or trailing data). Blocks on file
/// I/O; thread-safe.
IdxArray read_idx(const std::string& path, IdxKind kind);

}  // namespace dtrain::data
