// Crash-safe file replacement: a reader sees the old file or the new one, never a torn one.
// Does not lock: one writer per path is the caller's rule (the chief, the launcher). Reads are
// bounded: only regular files, never more bytes than the caller allows.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/unique_fd.h"

namespace dtrain::common {

/// Writes bytes to a temporary file beside path, fsyncs it, renames it over path and fsyncs
/// the folder. The folder must exist. Throws IoError naming the path and the failed call;
/// on failure the temporary file is removed and path is untouched. Blocks on disk I/O.
void write_file_atomically(const std::string& path, std::string_view bytes);

/// Appends line (newline included) with one write() on fd, opened with O_APPEND, so a reader
/// never sees half a line, even if this process dies right after. Throws IoError naming path
/// (what fd is) and the cause (a short write: the disk is full).
void append_line(int fd, std::string_view line, const std::string& path);
/// The same on path, created (0644) when missing; for records written now and then (metrics).
void append_line(const std::string& path, std::string_view line);

/// fsync of a folder, so a rename or create inside it survives a crash. Throws IoError.
void fsync_directory(const std::string& dir);

/// Default cap of read_file: far above any file dtrain reads whole, far below what would exhaust
/// a machine's memory.
inline constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;
/// Cap for JSON a person writes (job files, train configs): thousands of times any real one.
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t{16} << 20;

/// Opens path for reading. Refuses, with IoError naming the path and what it is, anything but a
/// regular file (a FIFO, a device such as /dev/zero, a socket, a folder), and never blocks on
/// one (a FIFO with no writer). size, when given, receives the file's size when opened.
UniqueFd open_regular_file(const std::string& path, uint64_t* size = nullptr);

/// Reads exactly n bytes from fd's position; IoError naming path when the file ends first.
std::string read_exactly(int fd, size_t n, const std::string& path);

/// Whole file as bytes, at most max_bytes of them. Throws IoError naming the path when it cannot
/// be read, is not a regular file (open_regular_file) or is longer than max_bytes. Files that do
/// not know their size (/proc) are read to their end, up to the same cap.
std::string read_file(const std::string& path, uint64_t max_bytes = kMaxReadBytes);

}  // namespace dtrain::common
