// Reads arrays out of .npz files (np.savez, np.savez_compressed): zip archives of .npy members,
// read through common/zip_reader.h (the archive whole in memory, stored or deflated members,
// zip64). A stored member's data stays in the archive's bytes (not copied again), a deflated one
// is inflated into a buffer that grows with what the stream really yields, up to the size its
// header promises. Also gives any member's bytes (a .keras archive's config.json). The zip
// itself is ZipReader's; here only keys (names less ".npy") and the .npy headers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/zip_reader.h"
#include "worker/data/npy_file.h"

namespace dtrain::data {

/// An opened .npz archive. Its central directory is read and checked against the file's size
/// when it is opened; members are read on demand. Copies share the file's bytes, which a stored
/// member's array keeps alive. Blocks on file I/O.
class NpzFile {
 public:
  /// ConfigError "<path>: ..." when the file is missing, not a regular file, or not a zip
  /// archive this reader takes (no end record, a directory that runs past the file, two
  /// members of one key, ...).
  explicit NpzFile(const std::string& path);

  const std::string& path() const { return zip_.path(); }
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
  std::string read_bytes(const std::string& name) const { return zip_.read_bytes(name); }

 private:
  NpyArray read_deflated(const common::ZipMember& member, const std::string& where,
                         const std::string& expected) const;

  common::ZipReader zip_;
  std::vector<std::string> keys_;  ///< zip_.members()'s names less ".npy", in the same order
};

}  // namespace dtrain::data
