// See zip_reader.h. Layout from PKWARE's APPNOTE: the end-of-central-directory record (zip64's
// locator and record when present) gives the central directory; each entry gives a member's
// sizes, CRC-32 and local header. Every offset and size is checked against the file's bytes
// before it is used; the CRC-32 of every member is checked when it is read.
#include "common/zip_reader.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "common/errors.h"

namespace dtrain::common {
namespace {

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
constexpr size_t kZlibChunk = size_t{1} << 30;  // zlib counts in 32 bits

uint64_t get(const uint8_t* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

}  // namespace

uint32_t zip_crc32(const uint8_t* data, uint64_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  return static_cast<uint32_t>(crc32_z(crc, data, static_cast<size_t>(size)));
}

void check_zip_crc(const std::string& where, uint32_t want, uint32_t have) {
  if (want != have)
    fail(where,
         fmt::format("CRC-32 mismatch: the directory says {:08x}, data has {:08x}", want, have));
}

ZipReader::ZipReader(const std::string& path) : ZipReader(std::make_shared<FileBytes>(path)) {}

ZipReader::ZipReader(std::shared_ptr<const FileBytes> file) : file_(std::move(file)) {
  const std::string& path = file_->path();
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

void ZipReader::read_directory(uint64_t offset, uint64_t size, uint64_t entries) {
  const std::string& path = file_->path();
  const uint8_t* p = file_->data() + offset;
  const uint8_t* const limit = p + size;
  members_.reserve(static_cast<size_t>(entries));
  std::unordered_set<std::string> names;  // a hostile directory may hold a million names
  for (uint64_t i = 0; i < entries; ++i) {
    if (static_cast<uint64_t>(limit - p) < kCentralBytes || get(p, 4) != kCentralSignature)
      fail(path, fmt::format("bad zip archive: central directory entry {} is damaged", i));
    ZipMember m;
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
    if (!names.insert(m.name).second) fail(path, fmt::format("two members are named '{}'", m.name));
    members_.push_back(std::move(m));
    p += kCentralBytes + name_len + extra_len + comment_len;
  }
}

const ZipMember* ZipReader::find(const std::string& name) const {
  auto it = std::find_if(members_.begin(), members_.end(),
                         [&](const ZipMember& m) { return m.name == name; });
  return it == members_.end() ? nullptr : &*it;
}

const uint8_t* ZipReader::member_data(const ZipMember& m, const std::string& where) const {
  if (m.flags & 1) fail(where, "the member is encrypted");
  if (m.method != kZipStored && m.method != kZipDeflated)
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

const uint8_t* ZipReader::stored_data(const ZipMember& m, const std::string& where) const {
  const uint8_t* data = member_data(m, where);
  if (m.compressed != m.uncompressed)
    fail(where, fmt::format("bad zip archive: a stored member of {} bytes claims {}", m.compressed,
                            m.uncompressed));
  check_zip_crc(where, m.crc, zip_crc32(data, m.compressed));
  return data;
}

std::shared_ptr<const uint8_t> ZipReader::share(const uint8_t* p) const {
  DT_ENFORCE(p >= file_->data() && p <= file_->data() + file_->size(),
             "share: a pointer outside {}'s bytes", path());
  return std::shared_ptr<const uint8_t>(file_, p);
}

std::string ZipReader::read_bytes(const std::string& name) const {
  const std::string where = fmt::format("{}: {}", path(), name);
  const ZipMember* found = find(name);
  if (found == nullptr) fail(where, "no such member in the archive");
  const ZipMember& m = *found;
  if (m.method == kZipStored) {
    const uint8_t* data = stored_data(m, where);
    return std::string(reinterpret_cast<const char*>(data), static_cast<size_t>(m.compressed));
  }
  // The text grows with what the stream yields, up to what the directory says (a bomb stops).
  ZipInflater in(member_data(m, where), m.compressed, where);
  std::string text;
  const uint64_t have = in.read_growing(text, m.uncompressed, 1 << 16);
  if (have < m.uncompressed || !in.at_end()) {
    fail(where, fmt::format("the deflated member yields {} bytes, the directory says {}",
                            have < m.uncompressed ? std::to_string(have)
                                                  : "more than " + std::to_string(have),
                            m.uncompressed));
  }
  check_zip_crc(where, m.crc, in.crc());
  return text;
}

struct ZipInflater::State {
  z_stream zs{};
  uint64_t left = 0;  ///< compressed bytes not yet given to zlib
  std::string where;
  bool ended = false;
  uLong crc = crc32(0L, Z_NULL, 0);
};

ZipInflater::ZipInflater(const uint8_t* data, uint64_t size, std::string where)
    : state_(std::make_unique<State>()) {
  state_->left = size;
  state_->where = std::move(where);
  state_->zs.next_in = const_cast<Bytef*>(data);
  DT_ENFORCE(inflateInit2(&state_->zs, -MAX_WBITS) == Z_OK, "inflateInit2 failed");
}

ZipInflater::~ZipInflater() {
  if (state_) inflateEnd(&state_->zs);
}

ZipInflater::ZipInflater(ZipInflater&&) noexcept = default;

ZipInflater& ZipInflater::operator=(ZipInflater&& other) noexcept {
  if (this != &other) {
    if (state_) inflateEnd(&state_->zs);
    state_ = std::move(other.state_);
  }
  return *this;
}

size_t ZipInflater::read(uint8_t* out, size_t n) {
  State& s = *state_;
  size_t done = 0;
  while (done < n && !s.ended) {
    if (s.zs.avail_in == 0) {
      s.zs.avail_in = static_cast<uInt>(std::min<uint64_t>(s.left, kZlibChunk));
      s.left -= s.zs.avail_in;
    }
    const size_t step = std::min(n - done, kZlibChunk);
    s.zs.next_out = out + done;
    s.zs.avail_out = static_cast<uInt>(step);
    const int rc = inflate(&s.zs, Z_NO_FLUSH);
    done += step - s.zs.avail_out;
    if (rc == Z_STREAM_END) {
      s.ended = true;
    } else if (rc == Z_DATA_ERROR) {
      fail(s.where, fmt::format("bad deflate data ({})", s.zs.msg ? s.zs.msg : "data error"));
    } else if (rc == Z_BUF_ERROR && s.zs.avail_in == 0 && s.left == 0) {
      fail(s.where, "truncated deflate data");
    } else {
      DT_ENFORCE(rc == Z_OK || rc == Z_BUF_ERROR, "inflate returned {}", rc);
    }
  }
  s.crc = crc32_z(s.crc, out, done);
  return done;
}

bool ZipInflater::at_end() {
  uint8_t extra = 0;
  return state_->ended || read(&extra, 1) == 0;
}

uint32_t ZipInflater::crc() const {
  return static_cast<uint32_t>(state_->crc);
}

}  // namespace dtrain::common
