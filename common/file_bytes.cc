// See file_bytes.h. One open, an fstat before and after the reads: a file replaced, grown or
// truncated meanwhile is refused, not half read.
#include "common/file_bytes.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/unique_fd.h"

namespace dtrain::common {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", where, what));
}

constexpr const char* kChanged =
    "changed while it was being read (is something writing it?); start again once it is written";

struct stat stat_of(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, fmt::format("cannot stat ({})", std::strerror(errno)));
  return st;
}

}  // namespace

FileBytes::FileBytes(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO with no writer would wait for one, forever.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) fail(path, fmt::format("cannot open ({})", std::strerror(errno)));
  const struct stat before = stat_of(fd.get(), path);
  if (!S_ISREG(before.st_mode)) {
    fail(path, fmt::format("not a regular file ({}); data files must be",
                           S_ISDIR(before.st_mode)    ? "a folder"
                           : S_ISFIFO(before.st_mode) ? "a FIFO"
                                                      : "a device or socket"));
  }
  bytes_.resize(static_cast<size_t>(before.st_size));
  for (size_t done = 0; done < bytes_.size();) {
    const ssize_t got =
        ::pread(fd.get(), bytes_.data() + done, bytes_.size() - done, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path, fmt::format("cannot read ({})", std::strerror(errno)));
    if (got == 0)
      fail(path, fmt::format("{} (it ended at byte {} of {})", kChanged, done, bytes_.size()));
    done += static_cast<size_t>(got);
  }
  const struct stat after = stat_of(fd.get(), path);
  if (after.st_size != before.st_size || after.st_ino != before.st_ino ||
      after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
      after.st_mtim.tv_nsec != before.st_mtim.tv_nsec) {
    fail(path, fmt::format("{} (its size or modification time differ after the read)", kChanged));
  }
}

}  // namespace dtrain::common
