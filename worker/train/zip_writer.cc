// See zip_writer.h. Records as PKWARE's APPNOTE gives them: a local header before each member,
// the central directory after the last, its end record last; little-endian throughout. The fields
// Python's zipfile fills for a member it stores (made by Unix, version 2.0, mode 0600, the UTF-8
// flag only for a name that is not ASCII) are filled the same way.
#include "worker/train/zip_writer.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/errors.h"

namespace dtrain::train {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kDirectoryEnd = 0x06054b50;
constexpr uint16_t kVersion = 20;  // 2.0: stored members, folders
constexpr uint16_t kMadeByUnix = (3 << 8) | kVersion;
constexpr uint16_t kUtf8Name = 1 << 11;      // general purpose flag bit 11
constexpr uint32_t kMode0600 = 0600u << 16;  // rw-------, as zipfile gives a member
constexpr uint64_t kLimit = std::numeric_limits<uint32_t>::max();

void put(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

bool is_ascii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

uint32_t crc32_of(std::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (!bytes.empty()) {  // zlib takes a uInt length: feed it at most 1 GiB at a time
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes.size(), size_t{1} << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), n);
    bytes.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

ZipWriter::ZipWriter(std::time_t saved) {
  std::tm t{};
  localtime_r(&saved, &t);
  const int year = std::max(t.tm_year + 1900, 1980);  // DOS dates start in 1980
  dos_date_ = static_cast<uint16_t>(((year - 1980) << 9) | ((t.tm_mon + 1) << 5) | t.tm_mday);
  dos_time_ = static_cast<uint16_t>((t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec / 2));
}

void ZipWriter::add(std::string_view name, std::string_view bytes) {
  DT_ENFORCE(!name.empty() && name.size() <= 0xffff, "zip member name of {} bytes", name.size());
  DT_ENFORCE(count_ < 0xffff, "more than 65535 zip members");
  DT_ENFORCE(bytes.size() < kLimit && data_.size() + bytes.size() + name.size() + 30 < kLimit,
             "zip member {} of {} bytes needs Zip64, which this writer does not have", name,
             bytes.size());
  const uint32_t crc = crc32_of(bytes);
  const uint16_t flags = is_ascii(name) ? 0 : kUtf8Name;
  const uint64_t offset = data_.size();
  put(data_, kLocalHeader, 4);
  put(data_, kVersion, 2), put(data_, flags, 2), put(data_, 0, 2);  // method 0: stored
  put(data_, dos_time_, 2), put(data_, dos_date_, 2);
  put(data_, crc, 4), put(data_, bytes.size(), 4), put(data_, bytes.size(), 4);
  put(data_, name.size(), 2), put(data_, 0, 2);  // no extra field
  data_.append(name).append(bytes);

  put(directory_, kDirectoryEntry, 4);
  put(directory_, kMadeByUnix, 2), put(directory_, kVersion, 2), put(directory_, flags, 2);
  put(directory_, 0, 2), put(directory_, dos_time_, 2), put(directory_, dos_date_, 2);
  put(directory_, crc, 4), put(directory_, bytes.size(), 4), put(directory_, bytes.size(), 4);
  put(directory_, name.size(), 2), put(directory_, 0, 2), put(directory_, 0, 2);  // extra, comment
  put(directory_, 0, 2), put(directory_, 0, 2), put(directory_, kMode0600, 4);    // disk, internal
  put(directory_, offset, 4);
  directory_.append(name);
  ++count_;
}

std::string ZipWriter::finish() {
  DT_ENFORCE(data_.size() + directory_.size() < kLimit, "a zip of {} bytes needs Zip64",
             data_.size() + directory_.size());
  const uint64_t directory_offset = data_.size();
  std::string out = std::move(data_);
  out.append(directory_);
  put(out, kDirectoryEnd, 4), put(out, 0, 2), put(out, 0, 2);  // this disk, the directory's
  put(out, count_, 2), put(out, count_, 2);
  put(out, directory_.size(), 4), put(out, directory_offset, 4), put(out, 0, 2);  // no comment
  data_.clear();
  directory_.clear();
  count_ = 0;
  return out;
}

}  // namespace dtrain::train
