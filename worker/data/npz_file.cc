// See npz_file.h. The archive's checks (directory, local headers, CRC-32, deflate streams) are
// ZipReader's; what is checked here is that keys are unique and that each member is an .npy
// file holding exactly the data its header promises.
#include "worker/data/npz_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <unordered_set>

#include "common/errors.h"

namespace dtrain::data {
namespace {

using common::ConfigError;
using common::ZipMember;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", where, what));
}

std::string key_of(const std::string& name) {
  const size_t suffix = name.size() >= 4 ? name.size() - 4 : 0;
  return name.compare(suffix, std::string::npos, ".npy") == 0 ? name.substr(0, suffix) : name;
}

// A deflated member as the stream read_npy_header parses from.
class InflaterReader : public ByteReader {
 public:
  explicit InflaterReader(common::ZipInflater& in) : in_(in) {}
  size_t read(uint8_t* out, size_t n) override { return in_.read(out, n); }

 private:
  common::ZipInflater& in_;
};

}  // namespace

NpzFile::NpzFile(const std::string& path) : zip_(path) {
  keys_.reserve(zip_.members().size());
  std::unordered_set<std::string> seen;  // a hostile directory may hold a million names
  for (const ZipMember& m : zip_.members()) {
    keys_.push_back(key_of(m.name));
    if (!seen.insert(keys_.back()).second)
      fail(path, fmt::format("two members are named '{}'", m.name));
  }
}

std::vector<std::string> NpzFile::keys() const {
  return keys_;
}

bool NpzFile::has(const std::string& key) const {
  return std::find(keys_.begin(), keys_.end(), key) != keys_.end();
}

NpyArray NpzFile::read(const std::string& key, const std::string& expected) const {
  const std::string where = fmt::format("{}: {}", path(), key);
  auto it = std::find(keys_.begin(), keys_.end(), key);
  if (it == keys_.end()) {
    std::vector<std::string> names = keys_;
    constexpr size_t kListed = 20;
    std::string more = names.size() > kListed ? fmt::format(", ... ({} in all)", names.size()) : "";
    names.resize(std::min(names.size(), kListed));
    fail(where,
         fmt::format("no such array in the archive (it has: {}{})",
                     names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", ")), more));
  }
  const ZipMember& m = zip_.members()[static_cast<size_t>(it - keys_.begin())];
  if (m.method == common::kZipDeflated) return read_deflated(m, where, expected);
  const uint8_t* data = zip_.stored_data(m, where);
  MemoryReader in(data, m.compressed);
  NpyHeader header = read_npy_header(in, m.compressed, where, expected);
  NpyArray array{header.descr, header.dtype, header.shape,
                 header.count, nullptr,      header.data_bytes};
  array.data = zip_.share(data + header.data_offset);
  return array;
}

NpyArray NpzFile::read_deflated(const ZipMember& m, const std::string& where,
                                const std::string& expected) const {
  common::ZipInflater inflater(zip_.member_data(m, where), m.compressed, where);
  InflaterReader in(inflater);
  NpyHeader header = read_npy_header(in, m.uncompressed, where, expected);
  // The buffer grows with what the stream yields, not with what the header claims.
  auto buffer = std::make_shared<std::vector<uint8_t>>();
  const uint64_t want = header.data_bytes;
  const uint64_t have =
      inflater.read_growing(*buffer, want, std::max<uint64_t>(m.compressed * 4, 1 << 24));
  if (have < want || !inflater.at_end()) {
    fail(where,
         fmt::format("the deflated member yields {} bytes of data, its header promises {}",
                     have < want ? std::to_string(have) : "more than " + std::to_string(want),
                     want));
  }
  common::check_zip_crc(where, m.crc, inflater.crc());
  NpyArray array{header.descr, header.dtype, header.shape, header.count, nullptr, want};
  array.data = std::shared_ptr<const uint8_t>(buffer, buffer->data());
  return array;
}

}  // namespace dtrain::data
