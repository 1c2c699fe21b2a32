// The safetensors format of dtrain's checkpoints and final model: an 8-byte little-endian header
// length, a JSON header (tensor names, dtypes, shapes, data offsets, string metadata with a
// CRC-32 "checksum"), then raw little-endian float32 data. Encoding, decoding and bounded,
// header-first reading only; which files a run keeps is checkpoint.h's business.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::train {

/// What a file's "checksum" covers, told apart by its prefix. kMetadataAndData ("crc32:"): every
/// other metadata entry, then the data section, which Python tools check (model files).
/// kIndexToo ("crc32-index:"): the same plus, between them, each tensor's name, dtype, shape and
/// data_offsets, so a header that points a tensor at another's bytes fails it (checkpoints).
enum class ChecksumScope { kMetadataAndData, kIndexToo };

/// A tensor to write: a view, not owned.
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  size_t count = 0;
};

/// A tensor read back.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> tensors;
  ChecksumScope checksum_scope = ChecksumScope::kMetadataAndData;  ///< what it verified
};

/// safetensors bytes; tensors in the given order and laid out back to back, metadata keys
/// sorted, and a "checksum" entry of scope added. Same input, same bytes.
std::string encode_safetensors(const std::vector<TensorView>& tensors,
                               std::map<std::string, std::string> metadata,
                               ChecksumScope scope = ChecksumScope::kMetadataAndData);
/// Parses and verifies bytes (a checksum of either scope); throws IoError naming path and what is
/// wrong (truncated, bad header, checksum mismatch, tensors' data_offsets that overlap, leave
/// gaps or go past the data...). Headers nest at most common::kMaxJsonDepth levels.
SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& path);
/// Reads and verifies the file at path, the header first: it must be at most 100 MiB, and the
/// file must hold exactly the data it describes, which is all that is then read. Refuses what is
/// not a regular file (a FIFO, /dev/zero, a folder). Errors as decode_safetensors.
SafetensorsFile read_safetensors(const std::string& path);
/// The __metadata__ of the file at path, read without its data (not verified: no checksum).
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

}  // namespace dtrain::train
