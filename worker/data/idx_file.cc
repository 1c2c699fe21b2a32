// See idx_file.h. zlib is used here and nowhere else in the data pipeline; the whole file is
// read into memory first (Fashion-MNIST's largest file is 47 MB), then checked. A gzip file's
// decompressed copy is kept in the cache of idx_cache.h and read from there next time.
#include "worker/data/idx_file.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "common/errors.h"
#include "worker/data/idx_cache.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", path, what));
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

std::string read_raw(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail(path, fmt::format("cannot open ({})", std::strerror(errno)));
  // One read of the size the file says it has (no growing string for a 47 MB file), then
  // whatever follows if it grew meanwhile.
  struct stat st {};
  std::string bytes;
  if (::fstat(::fileno(file.get()), &st) == 0 && st.st_size > 0 &&
      static_cast<uint64_t>(st.st_size) <= kMaxIdxBytes) {
    bytes.resize(static_cast<size_t>(st.st_size));
    bytes.resize(std::fread(bytes.data(), 1, bytes.size(), file.get()));
  }
  char buffer[1 << 16];
  for (;;) {
    size_t got = std::fread(buffer, 1, sizeof buffer, file.get());
    bytes.append(buffer, got);
    if (got < sizeof buffer) break;
    if (bytes.size() > kMaxIdxBytes) fail(path, "file is larger than 4 GiB");
  }
  if (std::ferror(file.get())) fail(path, fmt::format("cannot read ({})", std::strerror(errno)));
  return bytes;
}

bool has_gzip_magic(const std::string& bytes, size_t at) {
  return bytes.size() >= at + 2 && static_cast<unsigned char>(bytes[at]) == 0x1f &&
         static_cast<unsigned char>(bytes[at + 1]) == 0x8b;
}

struct InflateEnder {
  z_stream* stream;
  ~InflateEnder() { inflateEnd(stream); }
};

// Hands zlib the next piece of packed from position `from` (zlib counts input in 32 bits).
void feed(z_stream& zs, const std::string& packed, size_t from, size_t& fed) {
  size_t n = std::min(packed.size() - from, size_t{1} << 30);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data() + from));
  zs.avail_in = static_cast<uInt>(n);
  fed = from + n;
}

// Decompresses one or more concatenated gzip members; anything else after them is an error.
std::string gunzip(const std::string& path, const std::string& packed) {
  constexpr size_t kChunk = size_t{1} << 20;
  z_stream zs{};
  DT_ENFORCE(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "inflateInit2 failed");
  InflateEnder ender{&zs};
  std::string out;
  size_t fed = 0;  // bytes of packed handed to zlib so far
  feed(zs, packed, 0, fed);
  for (;;) {
    if (zs.avail_in == 0 && fed < packed.size()) feed(zs, packed, fed, fed);
    size_t used = out.size();
    out.resize(used + kChunk);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + used);
    zs.avail_out = static_cast<uInt>(kChunk);
    int rc = inflate(&zs, Z_NO_FLUSH);
    out.resize(used + kChunk - zs.avail_out);
    if (out.size() > kMaxIdxBytes) fail(path, "gzip stream decompresses to more than 4 GiB");
    if (rc == Z_DATA_ERROR) {
      fail(path, fmt::format("not a valid gzip stream ({})", zs.msg ? zs.msg : "data error"));
    }
    DT_ENFORCE(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR, "inflate returned {}", rc);
    bool input_done = zs.avail_in == 0 && fed == packed.size();
    if (rc == Z_BUF_ERROR && input_done) fail(path, "not a valid gzip stream (truncated)");
    if (rc != Z_STREAM_END) continue;
    size_t next = fed - zs.avail_in;
    if (next == packed.size()) return out;
    if (!has_gzip_magic(packed, next)) {
      fail(path, fmt::format("{} unexpected bytes after the gzip stream", packed.size() - next));
    }
    DT_ENFORCE(inflateReset(&zs) == Z_OK, "inflateReset failed");
    feed(zs, packed, next, fed);
  }
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
    fail(path, fmt::format("trailing bytes: header says {}, file has {}{} ({} too many)",
                           describe_data(dims, want), have, unit, have - want));
  }
}

}  // namespace

std::string read_file_maybe_gzip(const std::string& path) {
  std::string bytes = read_raw(path);
  if (!has_gzip_magic(bytes, 0)) return bytes;
  return gunzip(path, bytes);
}

namespace {

// The IDX array in bytes (the whole decompressed file), checked as kind; errors name path.
IdxArray parse_idx(const std::string& path, const std::string& bytes, IdxKind kind) {
  if (bytes.size() < 4)
    fail(path, fmt::format("too short for an IDX file ({} bytes)", bytes.size()));
  check_magic(path, big_endian_u32(bytes, 0), kind);
  const size_t rank = kind == IdxKind::kImages ? 3 : 1;
  const size_t header = 4 + 4 * rank;
  if (bytes.size() < header) {
    fail(path,
         fmt::format("truncated: the header needs {} bytes, file has {}", header, bytes.size()));
  }
  IdxArray array;
  uint64_t want = 1;
  for (size_t i = 0; i < rank; ++i) {
    uint32_t dim = big_endian_u32(bytes, 4 + 4 * i);
    if (dim == 0) fail(path, fmt::format("dimension {} of the header is 0", i));
    want *= dim;  // at most 2^32 * 4 GiB after the check below: no overflow
    if (want > kMaxIdxBytes) fail(path, "header describes more than 4 GiB of data");
    array.dims.push_back(dim);
  }
  check_length(path, array.dims, want, bytes.size() - header);
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return array;
}

}  // namespace

IdxArray read_idx(const std::string& path, IdxKind kind) {
  std::string bytes = read_raw(path);
  if (!has_gzip_magic(bytes, 0)) return parse_idx(path, bytes, kind);
  std::optional<std::string> dir = idx_cache_dir();
  std::optional<std::string> cache = dir ? idx_cache_path(*dir, path) : std::nullopt;
  if (cache && std::filesystem::exists(*cache)) {
    try {
      return parse_idx(*cache, read_raw(*cache), kind);
    } catch (const common::ConfigError& e) {  // damaged: make it again
      spdlog::warn("ignoring the cached copy: {}", e.what());
    }
  }
  std::string unpacked = gunzip(path, bytes);
  IdxArray array = parse_idx(path, unpacked, kind);
  if (cache) store_idx_cache(*cache, unpacked);
  return array;
}

}  // namespace dtrain::data
