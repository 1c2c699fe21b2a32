// Crash-safe file replacement: a reader sees the old file or the new one, never a torn one.
// Does not lock: one writer per path is the caller's rule (the chief, the launcher).
#pragma once

#include <string>
#include <string_view>

namespace dtrain::common {

/// Writes bytes to a temporary file beside path, fsyncs it, renames it over path and fsyncs
/// the folder. The folder must exist. Throws IoError naming the path and the failed call;
/// on failure the temporary file is removed and path is untouched. Blocks on disk I/O.
void write_file_atomically(const std::string& path, std::string_view bytes);

/// fsync of a folder, so a rename or create inside it survives a crash. Throws IoError.
void fsync_directory(const std::string& dir);

/// Whole file as bytes. Throws IoError naming the path when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace dtrain::common
