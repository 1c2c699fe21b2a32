// Reads arrays out of .npz files (np.savez, np.savez_compressed): zip archives of .npy members,
// stored or deflated, with the zip64 records NumPy writes. The archive is read whole into memory
// (FileBytes, never mapped); a stored member's data stays there (not copied again), a deflated one
// is inflated by zlib into a buffer that grows with what the stream really yields, up to the size
// its header promises. Also gives any member's bytes (a .keras archive's config.json). No
// encryption, multi-disk archives, other compression methods, or writing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/data/npy_file.h"

namespace dtrain::data {

/// An opened .npz archive. Its central directory is read and checked against the file's size
/// when it is opened; members are read on demand. Copies share the file's bytes, which a stored
/// member's array keeps alive. Blocks on file I/O.
class NpzFile {
 public:
  /// ConfigError "<path>: ..." when the file is missing, not a regular file, or not a zip
  /// archive this reader takes (no end record, a directory that runs past the file, ...).
  explicit NpzFile(const std::string& path);

  const std::string& path() const { return file_->path(); }
  /// Member names without their ".npy", in archive order (Keras: x_train, y_train, ...).
  std::vector<std::string> keys() const;
  bool has(const std::string& key) const;
  /// The array of member key + ".npy". ConfigError "<path>: <key>: <what is wrong>": a missing
  /// key (listing the keys there are), a local header that disagrees with the directory, a
  /// CRC mismatch, a deflate stream that is bad or yields other than the header promises.
  /// expected: as for read_npy_header.
  NpyArray read(const std::string& key, const std::string& expected = kNpyAnyDtype) const;
  /// The bytes of the member of this exact name, whatever they hold (a .keras archive's
  /// config.json). ConfigError "<path>: <name>: ..." as read() for a missing or bad member.
  std::string read_bytes(const std::string& name) const;

 private:
  struct Member {
    std::string name, key;
    uint16_t flags = 0, method = 0;
    uint32_t crc = 0;
    uint64_t compressed = 0, uncompressed = 0, local_offset = 0;
  };
  void read_directory(uint64_t offset, uint64_t size, uint64_t entries);
  /// Where m's data starts in the file, its local header and bounds checked.
  const uint8_t* member_data(const Member& m, const std::string& where) const;
  NpyArray read_deflated(const Member& member, const uint8_t* data, const std::string& where,
                         const std::string& expected) const;

  std::shared_ptr<FileBytes> file_;
  std::vector<Member> members_;
  uint64_t directory_offset_ = 0;  ///< members lie before it
};

}  // namespace dtrain::data
