// Zip archives made by hand, byte by byte, for the tests of the readers of .npz and .keras files
// (test/common/test_zip_reader.cc, test/data/test_npy_damaged.cc): stored or raw-deflated members,
// whose directory fields a test can make lie, optionally with zip64 records. Needs zlib.
#pragma once

#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::testing {

/// Appends value's low `bytes` bytes, little-endian (zip's and .npy's byte order).
inline void put(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

/// in as a raw deflate stream (no zlib or gzip wrapper), as a zip member holds it.
inline std::string raw_deflate(const std::string& in) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

/// One member of a hand-made archive. damage_entry edits its central directory entry; crc and
/// size, when set (>= 0), are what both its headers say instead of the truth.
struct ZipEntry {
  std::string name, contents;
  bool deflate = false;
  std::function<void(std::string& entry)> damage_entry = nullptr;
  int64_t crc = -1, size = -1;
};

/// A zip archive of entries, in order; damage_end edits the end of central directory record.
/// zip64: sizes and offsets in zip64 extra fields and records, as a writer does for members over
/// 4 GiB.
inline std::string zip(const std::vector<ZipEntry>& entries,
                       const std::function<void(std::string&)>& damage_end = nullptr,
                       bool zip64 = false) {
  std::string out, directory;
  for (const ZipEntry& e : entries) {
    const std::string data = e.deflate ? raw_deflate(e.contents) : e.contents;
    const uint32_t crc =
        e.crc >= 0 ? static_cast<uint32_t>(e.crc)
                   : static_cast<uint32_t>(crc32(
                         0, reinterpret_cast<const Bytef*>(e.contents.data()), e.contents.size()));
    const uint64_t size = e.size >= 0 ? static_cast<uint64_t>(e.size) : e.contents.size();
    std::string fields;  // version, flags, method, time, date, crc, sizes, name length, extra
    put(fields, 20, 2), put(fields, 0, 2), put(fields, e.deflate ? 8 : 0, 2);
    put(fields, 0, 4), put(fields, crc, 4), put(fields, data.size(), 4);
    put(fields, size, 4), put(fields, e.name.size(), 2), put(fields, 0, 2);
    std::string entry;
    put(entry, 0x02014b50, 4), put(entry, 20, 2);
    entry += fields;
    put(entry, 0, 2), put(entry, 0, 2), put(entry, 0, 2), put(entry, 0, 4);
    put(entry, out.size(), 4);
    entry += e.name;
    if (zip64) {
      for (size_t at : {20, 24, 42}) entry.replace(at, 4, "\xff\xff\xff\xff");
      entry.replace(30, 2, std::string("\x1c\0", 2));  // extra field length 28
      put(entry, 1, 2), put(entry, 24, 2), put(entry, size, 8);
      put(entry, data.size(), 8), put(entry, out.size(), 8);
    }
    if (e.damage_entry) e.damage_entry(entry);
    directory += entry;
    put(out, 0x04034b50, 4);
    out += fields + e.name + data;
  }
  std::string end;
  if (zip64) {
    put(end, 0x06064b50, 4), put(end, 44, 8), put(end, 45, 2), put(end, 45, 2), put(end, 0, 8);
    put(end, entries.size(), 8), put(end, entries.size(), 8), put(end, directory.size(), 8);
    put(end, out.size(), 8);
    put(end, 0x07064b50, 4), put(end, 0, 4), put(end, out.size() + directory.size(), 8);
    put(end, 1, 4);
    put(end, 0x06054b50, 4), put(end, 0, 4), put(end, 0xffff, 2), put(end, 0xffff, 2);
    put(end, 0xffffffff, 4), put(end, 0xffffffff, 4), put(end, 0, 2);
  } else {
    put(end, 0x06054b50, 4), put(end, 0, 4), put(end, entries.size(), 2);
    put(end, entries.size(), 2), put(end, directory.size(), 4), put(end, out.size(), 4);
    put(end, 0, 2);
  }
  if (damage_end) damage_end(end);
  return out + directory + end;
}

}  // namespace dtrain::testing
