// Reads zip archives (np.savez's .npz, Keras's .keras): the archive read whole into memory
// (file_bytes.h, never mapped), its directory checked against the file's size when it is opened,
// members stored or deflated, with the zip64 records NumPy writes. In common so that the launcher
// can read a .keras archive without the worker's data library
// (docs/design.md#one-reading-of-a-job). No encryption, multi-disk archives, other compression
// methods, or writing (zip_writer.h, in worker/train, writes them). What the members hold (.npy
// arrays, JSON) is the caller's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/file_bytes.h"

namespace dtrain::common {

inline constexpr uint16_t kZipStored = 0, kZipDeflated = 8;

/// One member as the central directory describes it, zip64 values in place of 0xffffffff.
struct ZipMember {
  std::string name;
  uint16_t flags = 0, method = 0;  ///< method: kZipStored, kZipDeflated, or one refused on read
  uint32_t crc = 0;                ///< CRC-32 of the uncompressed bytes
  uint64_t compressed = 0, uncompressed = 0, local_offset = 0;
};

/// An opened zip archive. Members are read on demand; each read checks the member's local header
/// and CRC-32. Copies share the file's bytes, which share() lets a caller's data keep alive.
/// Immutable after construction, so copies may be read from any thread. Blocks on file I/O when
/// constructed, never after.
class ZipReader {
 public:
  /// ConfigError "<path>: ..." when the file is missing, not a regular file (FileBytes), or not
  /// a zip archive this reader takes (no end record, a directory that runs past the file, a
  /// damaged entry, two members of one name, ...).
  explicit ZipReader(const std::string& path);
  /// The archive in bytes already read (a caller that looked at them first), errors as above.
  explicit ZipReader(std::shared_ptr<const FileBytes> file);

  const std::string& path() const { return file_->path(); }
  /// In archive order.
  const std::vector<ZipMember>& members() const { return members_; }
  /// The member of this exact name, or null.
  const ZipMember* find(const std::string& name) const;

  /// Where m's data (compressed bytes) starts in the archive's bytes, m.compressed of them, its
  /// local header and bounds checked. m must be one of members(). where names the member in
  /// errors (usually "<path>: <name>"): ConfigError "<where>: ..." for an encrypted member, a
  /// method other than stored or deflated, a local header missing or naming another member, or
  /// data that runs past the members.
  const uint8_t* member_data(const ZipMember& m, const std::string& where) const;
  /// member_data of a stored member, its sizes and CRC-32 checked as well: its m.compressed bytes
  /// are the member's contents. Errors as member_data's.
  const uint8_t* stored_data(const ZipMember& m, const std::string& where) const;
  /// A pointer to p, inside this archive's bytes, that keeps those bytes alive (an aliasing
  /// shared_ptr): for data left where it lies, not copied.
  std::shared_ptr<const uint8_t> share(const uint8_t* p) const;

  /// The contents of the member of this exact name, stored or deflated, its CRC-32 checked; a
  /// deflated member's buffer grows with what its stream yields, up to the size the directory
  /// says. ConfigError "<path>: <name>: ...": no such member, what member_data refuses, a CRC
  /// mismatch, a deflate stream that is bad or yields other than the directory says.
  std::string read_bytes(const std::string& name) const;

 private:
  void read_directory(uint64_t offset, uint64_t size, uint64_t entries);

  std::shared_ptr<const FileBytes> file_;
  std::vector<ZipMember> members_;
  uint64_t directory_offset_ = 0;  ///< members lie before it
};

/// A deflated member's raw deflate stream, inflated as it is read (zlib), with a CRC-32 of what
/// it yields. Does not own the compressed bytes: they must outlive it (keep the ZipReader).
/// Move-only (a moved-from one may only be destroyed or assigned); one thread at a time.
class ZipInflater {
 public:
  /// data, size: the member's compressed bytes (ZipReader::member_data, ZipMember::compressed).
  /// where names the member in errors, as for member_data.
  ZipInflater(const uint8_t* data, uint64_t size, std::string where);
  ~ZipInflater();
  ZipInflater(ZipInflater&&) noexcept;
  ZipInflater& operator=(ZipInflater&&) noexcept;

  /// Up to n bytes into out; fewer only where the stream ends. ConfigError "<where>: bad deflate
  /// data (...)" or "<where>: truncated deflate data".
  size_t read(uint8_t* out, size_t n);
  /// Reads up to want bytes into buffer (a std::string or std::vector<uint8_t>), which grows with
  /// what the stream yields: first bytes, then twice as many each time, never beyond want, so a
  /// directory or header that promises more than the stream holds costs no more memory than the
  /// stream. buffer ends holding the bytes read; returns their count (below want: the stream
  /// ended first). Errors as read().
  template <class Buffer>
  uint64_t read_growing(Buffer& buffer, uint64_t want, uint64_t first) {
    uint64_t have = 0, next = std::min(want, std::max<uint64_t>(first, 1));
    while (have < want) {
      buffer.resize(static_cast<size_t>(next));
      have += read(reinterpret_cast<uint8_t*>(buffer.data()) + have, buffer.size() - have);
      if (have < buffer.size()) break;
      next = std::min(want, next * 2);
    }
    buffer.resize(static_cast<size_t>(have));
    return have;
  }
  /// Whether the stream has ended; reads one more byte to find out when it has not yet (that
  /// byte is lost: call this only to check that nothing follows).
  bool at_end();
  /// CRC-32 of every byte read so far.
  uint32_t crc() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// CRC-32 (zip's and gzip's) of size bytes at data.
uint32_t zip_crc32(const uint8_t* data, uint64_t size);
/// ConfigError "<where>: CRC-32 mismatch: the directory says <want>, data has <have>" unless
/// they are equal.
void check_zip_crc(const std::string& where, uint32_t want, uint32_t have);

}  // namespace dtrain::common
