// POSIX implementation of atomic_file.h (open/write/fsync/rename).
#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

}  // namespace

void fsync_directory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_io("cannot open folder", dir, errno);
  if (::fsync(fd.get()) != 0) throw_io("cannot fsync folder", dir, errno);
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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw IoError(fmt::format("cannot read {}: read failed", path));
  return out.str();
}

}  // namespace dtrain::common
