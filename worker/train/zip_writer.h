// A zip archive built in memory from whole members, each stored (not compressed), as Python's
// zipfile writes a .keras file (docs/design.md#the-model-as-a-graph, Keras's files). Writes no
// file itself (the caller replaces its file atomically) and has no Zip64: an archive or a member
// of 4 GiB or more, or more than 65535 members, is an error. Reading zips is common::ZipReader's.
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

namespace dtrain::train {

class ZipWriter {
 public:
  /// saved: the members' modification time (local time, DOS resolution of two seconds).
  explicit ZipWriter(std::time_t saved);

  /// Appends a member named name (ASCII or UTF-8; a '/' makes folders) holding bytes, with its
  /// CRC-32. Throws EnforceError past the limits above or for an empty name.
  void add(std::string_view name, std::string_view bytes);
  /// The archive: the members in order, then the central directory. Ends the writer.
  std::string finish();

 private:
  std::string data_;       ///< local headers and members so far
  std::string directory_;  ///< central directory entries so far
  size_t count_ = 0;
  uint16_t dos_time_ = 0, dos_date_ = 0;
};

}  // namespace dtrain::train
