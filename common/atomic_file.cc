// POSIX implementation of atomic_file.h (open/write/fsync/rename).
#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/errors.h"
#include "common/unique_fd.h"

namespace dtrain::common {
namespace {

[[noreturn]] void throw_io(const std::string& what, const std::string& path, int err) {
  throw IoError(fmt::format("{} {}: {}", what, path, std::strerror(err)));
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io("cannot write", path, errno);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// Reads until n bytes or the end of the file; returns how many it got.
size_t read_some(int fd, char* out, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::read(fd, out + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_io("cannot read", path, errno);
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

void fsync_directory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_io("cannot open folder", dir, errno);
  if (::fsync(fd.get()) != 0) throw_io("cannot fsync folder", dir, errno);
}

void append_line(int fd, std::string_view line, const std::string& path) {
  const ssize_t written = ::write(fd, line.data(), line.size());
  if (written == static_cast<ssize_t>(line.size())) return;
  throw IoError(fmt::format("cannot append to {}: {}", path,
                            written < 0 ? std::strerror(errno) : "short write (disk full?)"));
}

void append_line(const std::string& path, std::string_view line) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd.valid())
    throw IoError(fmt::format("cannot append to {}: {}", path, std::strerror(errno)));
  append_line(fd.get(), line, path);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  std::filesystem::path target(path);
  std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  std::string temp = fmt::format("{}/.{}.tmp.{}", dir, target.filename().string(), ::getpid());
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw_io("cannot create", temp, errno);
  try {
    write_all(fd.get(), bytes, temp);
    if (::fsync(fd.get()) != 0) throw_io("cannot fsync", temp, errno);
    if (fd.reset() != 0) throw_io("cannot close", temp, errno);
    if (::rename(temp.c_str(), path.c_str()) != 0) throw_io("cannot rename onto", path, errno);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  fsync_directory(dir);
}

UniqueFd open_regular_file(const std::string& path, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait for one, forever.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) throw_io("cannot read", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_io("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    throw IoError(
        fmt::format("cannot read {}: it is {}, not a regular file", path, file_kind(st.st_mode)));
  }
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_exactly(int fd, size_t n, const std::string& path) {
  std::string bytes(n, '\0');
  size_t done = read_some(fd, bytes.data(), n, path);
  if (done < n) {
    throw IoError(
        fmt::format("cannot read {}: it ends after {} of the {} bytes expected", path, done, n));
  }
  return bytes;
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  UniqueFd fd = open_regular_file(path, &size);
  auto too_long = [&] {
    return IoError(fmt::format("cannot read {}: it is longer than {} bytes, the most accepted here",
                               path, max_bytes));
  };
  if (size > max_bytes) throw too_long();
  // The size it says it has in one read; then to the end, in case it grew or does not say (/proc).
  std::string bytes(static_cast<size_t>(size), '\0');
  bytes.resize(read_some(fd.get(), bytes.data(), bytes.size(), path));
  char buffer[1 << 16];
  while (size_t got = read_some(fd.get(), buffer, sizeof buffer, path)) {
    if (got > max_bytes - bytes.size()) throw too_long();
    bytes.append(buffer, got);
  }
  return bytes;
}

}  // namespace dtrain::common
