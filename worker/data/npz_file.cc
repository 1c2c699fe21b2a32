// See npz_file.h. Layout from PKWARE's APPNOTE: the end-of-central-directory record (zip64's
// locator and record when present) gives the central directory; each entry gives a member's
// sizes, CRC-32 and local header. Every offset and size is checked against the file's bytes
// before it is used; the CRC-32 of every member is checked when it is read.
#include "worker/data/npz_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/errors.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", where, what));
}

constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr uint32_t kCentralSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint64_t kEndBytes = 22, kLocatorBytes = 20, kZip64EndBytes = 56;
constexpr uint64_t kCentralBytes = 46, kLocalBytes = 30;
constexpr uint16_t kStored = 0, kDeflated = 8;
constexpr size_t kZlibChunk = size_t{1} << 30;  // zlib counts in 32 bits

uint64_t get(const uint8_t* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

uint32_t crc_of(const uint8_t* data, uint64_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  return static_cast<uint32_t>(crc32_z(crc, data, static_cast<size_t>(size)));
}

// Raw deflate data inflated as it is read; counts and checksums what it yields.
class Inflater : public ByteReader {
 public:
  Inflater(const uint8_t* data, uint64_t size, std::string where)
      : left_(size), where_(std::move(where)) {
    zs_.next_in = const_cast<Bytef*>(data);
    DT_ENFORCE(inflateInit2(&zs_, -MAX_WBITS) == Z_OK, "inflateInit2 failed");
  }
  ~Inflater() override { inflateEnd(&zs_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  size_t read(uint8_t* out, size_t n) override {
    size_t done = 0;
    while (done < n && !ended_) {
      if (zs_.avail_in == 0) {
        zs_.avail_in = static_cast<uInt>(std::min<uint64_t>(left_, kZlibChunk));
        left_ -= zs_.avail_in;
      }
      const size_t step = std::min(n - done, kZlibChunk);
      zs_.next_out = out + done;
      zs_.avail_out = static_cast<uInt>(step);
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      done += step - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        ended_ = true;
      } else if (rc == Z_DATA_ERROR) {
        fail(where_, fmt::format("bad deflate data ({})", zs_.msg ? zs_.msg : "data error"));
      } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0 && left_ == 0) {
        fail(where_, "truncated deflate data");
      } else {
        DT_ENFORCE(rc == Z_OK || rc == Z_BUF_ERROR, "inflate returned {}", rc);
      }
    }
    crc_ = crc32_z(crc_, out, done);
    return done;
  }
  /// Whether the stream has ended; reads one more byte to find out when it has not yet.
  bool at_end() {
    uint8_t extra = 0;
    return ended_ || read(&extra, 1) == 0;
  }
  uint32_t crc() const { return static_cast<uint32_t>(crc_); }

 private:
  z_stream zs_{};
  uint64_t left_;
  std::string where_;
  bool ended_ = false;
  uLong crc_ = crc32(0L, Z_NULL, 0);
};

void check_crc(const std::string& where, uint32_t want, uint32_t have) {
  if (want != have)
    fail(where,
         fmt::format("CRC-32 mismatch: the directory says {:08x}, data has {:08x}", want, have));
}

}  // namespace

NpzFile::NpzFile(const std::string& path) : file_(std::make_shared<FileBytes>(path)) {
  const uint8_t* base = file_->data();
  const uint64_t size = file_->size();
  if (size < kEndBytes) fail(path, fmt::format("not a zip archive: {} bytes", size));
  // The end record: the last one whose comment runs exactly to the end of the file.
  uint64_t end = size - kEndBytes;
  const uint64_t lowest = size > kEndBytes + 0xffff ? size - kEndBytes - 0xffff : 0;
  while (
      !(get(base + end, 4) == kEndSignature && end + kEndBytes + get(base + end + 20, 2) == size)) {
    if (end == lowest) fail(path, "not a zip archive (no end of central directory record)");
    --end;
  }
  if (get(base + end + 4, 2) != 0 || get(base + end + 6, 2) != 0)
    fail(path, "multi-disk zip archives are not supported");
  uint64_t entries = get(base + end + 10, 2), cd_size = get(base + end + 12, 4);
  uint64_t cd_offset = get(base + end + 16, 4);
  directory_offset_ = end;
  if (end >= kLocatorBytes && get(base + end - kLocatorBytes, 4) == kZip64LocatorSignature) {
    const uint8_t* locator = base + end - kLocatorBytes;
    const uint64_t record = get(locator + 8, 8);
    if (record > end - kLocatorBytes || end - kLocatorBytes - record < kZip64EndBytes ||
        get(base + record, 4) != kZip64EndSignature) {
      fail(path, "bad zip64 end of central directory locator");
    }
    if (get(base + record + 16, 4) != 0 || get(base + record + 20, 4) != 0)
      fail(path, "multi-disk zip archives are not supported");
    entries = get(base + record + 32, 8);
    cd_size = get(base + record + 40, 8);
    cd_offset = get(base + record + 48, 8);
    directory_offset_ = record;
  }
  if (cd_offset > directory_offset_ || cd_size != directory_offset_ - cd_offset) {
    fail(path, fmt::format("bad zip archive: the central directory ({} bytes at {}) does not end "
                           "where its end record starts ({})",
                           cd_size, cd_offset, directory_offset_));
  }
  if (entries > cd_size / kCentralBytes)
    fail(path, fmt::format("bad zip archive: {} entries cannot fit {} bytes of directory", entries,
                           cd_size));
  directory_offset_ = cd_offset;
  read_directory(cd_offset, cd_size, entries);
}

void NpzFile::read_directory(uint64_t offset, uint64_t size, uint64_t entries) {
  const std::string& path = file_->path();
  const uint8_t* p = file_->data() + offset;
  const uint8_t* const limit = p + size;
  members_.reserve(static_cast<size_t>(entries));
  std::unordered_set<std::string> keys;  // a hostile directory may hold a million names
  for (uint64_t i = 0; i < entries; ++i) {
    if (static_cast<uint64_t>(limit - p) < kCentralBytes || get(p, 4) != kCentralSignature)
      fail(path, fmt::format("bad zip archive: central directory entry {} is damaged", i));
    Member m;
    m.flags = static_cast<uint16_t>(get(p + 8, 2));
    m.method = static_cast<uint16_t>(get(p + 10, 2));
    m.crc = static_cast<uint32_t>(get(p + 16, 4));
    m.compressed = get(p + 20, 4);
    m.uncompressed = get(p + 24, 4);
    const uint64_t name_len = get(p + 28, 2), extra_len = get(p + 30, 2);
    const uint64_t comment_len = get(p + 32, 2);
    m.local_offset = get(p + 42, 4);
    if (static_cast<uint64_t>(limit - p) < kCentralBytes + name_len + extra_len + comment_len)
      fail(path, fmt::format("bad zip archive: central directory entry {} runs past its end", i));
    m.name.assign(reinterpret_cast<const char*>(p + kCentralBytes), name_len);
    // zip64 extra field: the 64-bit values of the 32-bit fields that hold 0xffffffff, in order.
    const uint8_t* extra = p + kCentralBytes + name_len;
    for (uint64_t at = 0; at + 4 <= extra_len;) {
      const uint64_t id = get(extra + at, 2), len = get(extra + at + 2, 2);
      if (at + 4 + len > extra_len) fail(path, fmt::format("{}: bad zip extra field", m.name));
      uint64_t used = 0;
      for (uint64_t* field : {&m.uncompressed, &m.compressed, &m.local_offset}) {
        if (id != 1 || *field != 0xffffffff) continue;
        if (used + 8 > len) fail(path, fmt::format("{}: short zip64 extra field", m.name));
        *field = get(extra + at + 4 + used, 8);
        used += 8;
      }
      at += 4 + len;
    }
    const size_t suffix = m.name.size() >= 4 ? m.name.size() - 4 : 0;
    m.key =
        m.name.compare(suffix, std::string::npos, ".npy") == 0 ? m.name.substr(0, suffix) : m.name;
    if (!keys.insert(m.key).second) fail(path, fmt::format("two members are named '{}'", m.name));
    members_.push_back(std::move(m));
    p += kCentralBytes + name_len + extra_len + comment_len;
  }
}

std::vector<std::string> NpzFile::keys() const {
  std::vector<std::string> keys;
  for (const Member& m : members_) keys.push_back(m.key);
  return keys;
}

bool NpzFile::has(const std::string& key) const {
  return std::any_of(members_.begin(), members_.end(),
                     [&](const Member& m) { return m.key == key; });
}

NpyArray NpzFile::read(const std::string& key, const std::string& expected) const {
  const std::string where = fmt::format("{}: {}", path(), key);
  auto it =
      std::find_if(members_.begin(), members_.end(), [&](const Member& m) { return m.key == key; });
  if (it == members_.end()) {
    std::vector<std::string> names = keys();
    constexpr size_t kListed = 20;
    std::string more = names.size() > kListed ? fmt::format(", ... ({} in all)", names.size()) : "";
    names.resize(std::min(names.size(), kListed));
    fail(where,
         fmt::format("no such array in the archive (it has: {}{})",
                     names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", ")), more));
  }
  const Member& m = *it;
  const uint8_t* data = member_data(m, where);
  if (m.method == kDeflated) return read_deflated(m, data, where, expected);
  if (m.compressed != m.uncompressed)
    fail(where, fmt::format("bad zip archive: a stored member of {} bytes claims {}", m.compressed,
                            m.uncompressed));
  check_crc(where, m.crc, crc_of(data, m.compressed));
  MemoryReader in(data, m.compressed);
  NpyHeader header = read_npy_header(in, m.compressed, where, expected);
  NpyArray array{header.descr, header.dtype, header.shape,
                 header.count, nullptr,      header.data_bytes};
  array.data = std::shared_ptr<const uint8_t>(file_, data + header.data_offset);
  return array;
}

const uint8_t* NpzFile::member_data(const Member& m, const std::string& where) const {
  if (m.flags & 1) fail(where, "the member is encrypted");
  if (m.method != kStored && m.method != kDeflated)
    fail(where,
         fmt::format("compression method {} is not supported (stored or deflated)", m.method));
  const uint8_t* base = file_->data();
  const uint64_t at = m.local_offset;
  if (at > directory_offset_ || directory_offset_ - at < kLocalBytes ||
      get(base + at, 4) != kLocalSignature) {
    fail(where, fmt::format("bad zip archive: no local header at offset {}", at));
  }
  const uint64_t start = at + kLocalBytes + get(base + at + 26, 2) + get(base + at + 28, 2);
  if (start > directory_offset_ || directory_offset_ - start < m.compressed)
    fail(where, fmt::format("bad zip archive: {} bytes of data at offset {} run past the "
                            "members",
                            m.compressed, start));
  if (get(base + at + 26, 2) != m.name.size() ||
      std::memcmp(base + at + kLocalBytes, m.name.data(), m.name.size()) != 0) {
    fail(where, "bad zip archive: the local header names another member");
  }
  return base + start;
}

std::string NpzFile::read_bytes(const std::string& name) const {
  const std::string where = fmt::format("{}: {}", path(), name);
  auto it = std::find_if(members_.begin(), members_.end(),
                         [&](const Member& m) { return m.name == name; });
  if (it == members_.end()) fail(where, "no such member in the archive");
  const Member& m = *it;
  const uint8_t* data = member_data(m, where);
  if (m.method == kStored) {
    if (m.compressed != m.uncompressed)
      fail(where, fmt::format("bad zip archive: a stored member of {} bytes claims {}",
                              m.compressed, m.uncompressed));
    check_crc(where, m.crc, crc_of(data, m.compressed));
    return std::string(reinterpret_cast<const char*>(data), static_cast<size_t>(m.compressed));
  }
  // As read_deflated: the text grows with what the stream yields, up to what the directory says.
  Inflater in(data, m.compressed, where);
  std::string text;
  uint64_t have = 0, next = std::min<uint64_t>(m.uncompressed, 1 << 16);
  while (have < m.uncompressed) {
    text.resize(static_cast<size_t>(next));
    have += in.read(reinterpret_cast<uint8_t*>(text.data()) + have, text.size() - have);
    if (have < text.size()) break;
    next = std::min(m.uncompressed, next * 2);
  }
  if (have < m.uncompressed || !in.at_end()) {
    fail(where, fmt::format("the deflated member yields {} bytes, the directory says {}",
                            have < m.uncompressed ? std::to_string(have)
                                                  : "more than " + std::to_string(have),
                            m.uncompressed));
  }
  check_crc(where, m.crc, in.crc());
  text.resize(static_cast<size_t>(have));
  return text;
}

NpyArray NpzFile::read_deflated(const Member& m, const uint8_t* data, const std::string& where,
                                const std::string& expected) const {
  Inflater in(data, m.compressed, where);
  NpyHeader header = read_npy_header(in, m.uncompressed, where, expected);
  // The buffer grows with what the stream yields, not with what the directory claims.
  auto buffer = std::make_shared<std::vector<uint8_t>>();
  const uint64_t want = header.data_bytes;
  uint64_t have = 0, next = std::min<uint64_t>(want, std::max<uint64_t>(m.compressed * 4, 1 << 24));
  while (have < want) {
    buffer->resize(static_cast<size_t>(next));
    have += in.read(buffer->data() + have, buffer->size() - have);
    if (have < buffer->size()) break;
    next = std::min(want, next * 2);
  }
  if (have < want || !in.at_end()) {
    fail(where,
         fmt::format("the deflated member yields {} bytes of data, its header promises {}",
                     have < want ? std::to_string(have) : "more than " + std::to_string(want),
                     want));
  }
  check_crc(where, m.crc, in.crc());
  NpyArray array{header.descr, header.dtype, header.shape, header.count, nullptr, want};
  array.data = std::shared_ptr<const uint8_t>(buffer, buffer->data());
  return array;
}

}  // namespace dtrain::data
