// A regular file read whole into memory of its own, never mapped, and checked to be the file as
// it was while it was read. For the files dtrain parses whole (.npy, .npz, .keras archives); no
// size cap here (the caller's), no writing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::common {

/// A regular file's bytes, read whole into memory this object owns (move-only; shared through
/// shared_ptr). Never a mapping: a file rewritten while training runs (np.savez truncates first)
/// would make a mapping's reads SIGBUS, or silently show the new data; these bytes are the file
/// as it was read. ConfigError "<path>: ..." for a missing file, a folder, FIFO or device, and
/// for a file that changed while it was read (its size, inode or modification time differ after
/// the read, or it ended early). Blocks on file I/O.
class FileBytes {
 public:
  explicit FileBytes(const std::string& path);
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;

  const uint8_t* data() const { return bytes_.data(); }
  uint64_t size() const { return bytes_.size(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
};

}  // namespace dtrain::common
