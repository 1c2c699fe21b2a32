// See idx_file.h. zlib is used here and nowhere else in the data pipeline. The header is read and
// checked first, then the data the header promises (and no more) is read or inflated into memory
// (Fashion-MNIST's largest file is 47 MB). A gzip file's decompressed copy is kept in the cache
// of idx_cache.h and read from there next time.
#include "worker/data/idx_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "common/errors.h"
#include "common/unique_fd.h"
#include "worker/data/idx_cache.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", path, what));
}

// Bytes an IDX file is parsed from, in order: the file itself, or its gzip stream inflated.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  /// Up to n bytes into out; fewer only at the end. Throws ConfigError naming the file.
  virtual size_t read(char* out, size_t n) = 0;
  /// Most bytes left that can be known without reading them; 0 when unknown.
  virtual uint64_t known_left() const { return 0; }
};

// A regular file (FIFOs, devices and folders are refused when opened: they may never end).
class FileSource : public ByteSource {
 public:
  explicit FileSource(std::string path) : path_(std::move(path)) {
    // O_NONBLOCK: opening a FIFO with no writer would wait for one, forever.
    fd_.reset(::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (!fd_.valid()) fail(path_, fmt::format("cannot open ({})", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0)
      fail(path_, fmt::format("cannot stat ({})", std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) {
      fail(path_, fmt::format("not a regular file ({}); data files must be",
                              S_ISDIR(st.st_mode)    ? "a folder"
                              : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                     : "a device or socket"));
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  size_t read(char* out, size_t n) override {
    size_t done = 0;
    while (done < n) {
      ssize_t got = ::read(fd_.get(), out + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(path_, fmt::format("cannot read ({})", std::strerror(errno)));
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    position_ += done;
    return done;
  }
  uint64_t known_left() const override { return size_ > position_ ? size_ - position_ : 0; }
  uint64_t position() const { return position_; }
  uint64_t size() const { return std::max(size_, position_); }
  const std::string& path() const { return path_; }
  /// Whether the file starts with gzip's magic bytes (1f 8b); reads them and rewinds.
  bool starts_with_gzip_magic() {
    unsigned char magic[2] = {0, 0};
    size_t got = read(reinterpret_cast<char*>(magic), 2);
    if (::lseek(fd_.get(), 0, SEEK_SET) != 0) fail(path_, "cannot seek back to the start");
    position_ = 0;
    return got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  }

 private:
  std::string path_;
  common::UniqueFd fd_;
  uint64_t size_ = 0, position_ = 0;
};

// Inflates one or more concatenated gzip members as they are read, never more than asked for:
// a header can be checked before the rest is inflated. Anything else after the members is an
// error.
class GzipSource : public ByteSource {
 public:
  explicit GzipSource(FileSource& file) : file_(file), input_(kInputChunk) {
    DT_ENFORCE(inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK, "inflateInit2 failed");
  }
  ~GzipSource() override { inflateEnd(&zs_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  size_t read(char* out, size_t n) override {
    size_t done = 0;
    while (done < n && !finished_) {
      if (zs_.avail_in == 0) refill();
      size_t step = std::min(n - done, size_t{1} << 30);  // zlib counts output in 32 bits
      zs_.next_out = reinterpret_cast<Bytef*>(out + done);
      zs_.avail_out = static_cast<uInt>(step);
      int rc = inflate(&zs_, Z_NO_FLUSH);
      done += step - zs_.avail_out;
      check(rc);
      if (rc == Z_STREAM_END) next_member();
    }
    return done;
  }

 private:
  static constexpr size_t kInputChunk = size_t{1} << 20;

  // Moves the unread input to the front of the buffer and tops it up from the file.
  void refill() {
    size_t left = zs_.avail_in;
    if (left > 0) std::memmove(input_.data(), zs_.next_in, left);
    size_t got = file_.read(reinterpret_cast<char*>(input_.data()) + left, input_.size() - left);
    eof_ = got < input_.size() - left;
    zs_.next_in = input_.data();
    zs_.avail_in = static_cast<uInt>(left + got);
  }

  void check(int rc) {
    const std::string& path = file_.path();
    if (rc == Z_DATA_ERROR) {
      fail(path, fmt::format("not a valid gzip stream ({})", zs_.msg ? zs_.msg : "data error"));
    }
    DT_ENFORCE(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR, "inflate returned {}", rc);
    if (rc == Z_BUF_ERROR && zs_.avail_in == 0 && eof_)
      fail(path, "not a valid gzip stream (truncated)");
  }

  // After a member's end: the file ends, or another member follows.
  void next_member() {
    if (zs_.avail_in < 2 && !eof_) refill();
    if (zs_.avail_in == 0) {
      finished_ = true;
      return;
    }
    if (zs_.avail_in < 2 || zs_.next_in[0] != 0x1f || zs_.next_in[1] != 0x8b) {
      fail(file_.path(), fmt::format("{} unexpected bytes after the gzip stream",
                                     file_.size() - (file_.position() - zs_.avail_in)));
    }
    DT_ENFORCE(inflateReset(&zs_) == Z_OK, "inflateReset failed");
  }

  FileSource& file_;
  std::vector<Bytef> input_;
  z_stream zs_{};
  bool eof_ = false, finished_ = false;
};

// Up to n bytes of in (fewer only at its end).
std::string read_up_to(ByteSource& in, size_t n) {
  std::string bytes(n, '\0');
  bytes.resize(in.read(bytes.data(), n));
  return bytes;
}

// Up to want bytes of in, in a buffer grown as they arrive: memory follows what the file holds,
// not what its header claims.
std::vector<uint8_t> read_data(ByteSource& in, uint64_t want) {
  constexpr uint64_t kFirstBuffer = uint64_t{16} << 20;
  std::vector<uint8_t> data;
  size_t have = 0;
  uint64_t next = std::min(want, std::max(in.known_left(), kFirstBuffer));
  while (have < want) {
    data.resize(static_cast<size_t>(next));
    have += in.read(reinterpret_cast<char*>(data.data()) + have, data.size() - have);
    if (have < data.size()) break;  // the end of the file
    next = std::min(want, next * 2);
  }
  data.resize(have);
  return data;
}

// How many bytes are left in `in`, counted without keeping them; stops at kMaxIdxBytes.
uint64_t count_rest(ByteSource& in) {
  std::vector<char> buffer(size_t{1} << 16);
  uint64_t count = 0;
  while (count <= kMaxIdxBytes) {
    size_t got = in.read(buffer.data(), buffer.size());
    count += got;
    if (got < buffer.size()) break;
  }
  return count;
}

uint32_t big_endian_u32(const std::string& bytes, size_t at) {
  uint32_t value = 0;
  for (size_t i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

const char* kind_name(IdxKind kind) {
  return kind == IdxKind::kImages ? "images" : "labels";
}

void check_magic(const std::string& path, uint32_t magic, IdxKind kind) {
  const uint32_t expected = kind == IdxKind::kImages ? kIdxImagesMagic : kIdxLabelsMagic;
  if (magic == expected) return;
  std::string why = "not an IDX file of unsigned bytes";
  if ((magic & 0xffffff00u) == 0x00000800u) {
    const uint32_t rank = magic & 0xffu;
    why = fmt::format("the file has {} dimension{}, {} have {}", rank, rank == 1 ? "" : "s",
                      kind_name(kind), expected & 0xffu);
  }
  fail(path, fmt::format("bad magic 0x{:08x}, expected 0x{:08x} ({}): {}", magic, expected,
                         kind_name(kind), why));
}

// "60000 labels" or "60000 images of 28x28 (47040000 bytes)".
std::string describe_data(const std::vector<int64_t>& dims, uint64_t bytes) {
  if (dims.size() == 1) return fmt::format("{} labels", dims[0]);
  return fmt::format("{} images of {}x{} ({} bytes)", dims[0], dims[1], dims[2], bytes);
}

void check_length(const std::string& path, const std::vector<int64_t>& dims, uint64_t want,
                  uint64_t have) {
  const std::string unit = dims.size() == 1 ? "" : " bytes";
  if (have < want) {
    fail(path, fmt::format("truncated: header says {}, file has {}{}", describe_data(dims, want),
                           have, unit));
  }
  if (have > want) {
    std::string more = have > kMaxIdxBytes ? "more than 4 GiB" : std::to_string(have);
    fail(path, fmt::format("trailing bytes: header says {}, file has {}{} ({} too many)",
                           describe_data(dims, want), more, unit, have - want));
  }
}

// The header's dimensions, checked as kind, from the first bytes of in: nothing more is read
// before they are known good.
std::vector<int64_t> read_header(const std::string& path, ByteSource& in, IdxKind kind) {
  std::string magic = read_up_to(in, 4);
  if (magic.size() < 4)
    fail(path, fmt::format("too short for an IDX file ({} bytes)", magic.size()));
  check_magic(path, big_endian_u32(magic, 0), kind);
  const size_t rank = kind == IdxKind::kImages ? 3 : 1;
  std::string dims_bytes = read_up_to(in, 4 * rank);
  if (dims_bytes.size() < 4 * rank) {
    fail(path, fmt::format("truncated: the header needs {} bytes, file has {}", 4 + 4 * rank,
                           4 + dims_bytes.size()));
  }
  std::vector<int64_t> dims;
  uint64_t want = 1;
  for (size_t i = 0; i < rank; ++i) {
    uint32_t dim = big_endian_u32(dims_bytes, 4 * i);
    if (dim == 0) fail(path, fmt::format("dimension {} of the header is 0", i));
    want *= dim;  // at most 2^32 * 4 GiB after the check below: no overflow
    if (want > kMaxIdxBytes) fail(path, "header describes more than 4 GiB of data");
    dims.push_back(dim);
  }
  return dims;
}

// The IDX array in `in`, checked as kind; errors name path.
IdxArray parse_idx(const std::string& path, ByteSource& in, IdxKind kind) {
  IdxArray array;
  array.dims = read_header(path, in, kind);
  uint64_t want = 1;
  for (int64_t dim : array.dims) want *= static_cast<uint64_t>(dim);
  array.data = read_data(in, want);
  uint64_t have = array.data.size();
  if (have == want) have += count_rest(in);
  check_length(path, array.dims, want, have);
  return array;
}

// The file that holds array (header and data), as the cache keeps it.
std::string idx_file_bytes(const IdxArray& array, IdxKind kind) {
  std::string out;
  auto put = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  };
  put(kind == IdxKind::kImages ? kIdxImagesMagic : kIdxLabelsMagic);
  for (int64_t dim : array.dims) put(static_cast<uint32_t>(dim));
  out.append(array.data.begin(), array.data.end());
  return out;
}

}  // namespace

IdxArray read_idx(const std::string& path, IdxKind kind) {
  FileSource file(path);
  if (!file.starts_with_gzip_magic()) return parse_idx(path, file, kind);
  std::optional<std::string> dir = idx_cache_dir();
  std::optional<std::string> cache = dir ? idx_cache_path(*dir, path) : std::nullopt;
  if (cache && std::filesystem::exists(*cache)) {
    try {
      FileSource copy(*cache);
      return parse_idx(*cache, copy, kind);
    } catch (const common::ConfigError& e) {  // damaged: make it again
      spdlog::warn("ignoring the cached copy: {}", e.what());
    }
  }
  GzipSource unpacked(file);
  IdxArray array = parse_idx(path, unpacked, kind);
  if (cache) store_idx_cache(*cache, idx_file_bytes(array, kind));
  return array;
}

}  // namespace dtrain::data
