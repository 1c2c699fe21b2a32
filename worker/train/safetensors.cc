// See safetensors.h. The checksum covers the metadata (but itself), for checkpoints the tensor
// index too, and the data section, so a file cut short or changed anywhere is refused; a reader
// trusts the header's sizes and offsets only after checking them against the file.
#include "worker/train/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <tuple>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"

namespace dtrain::train {
namespace {

/// The Python safetensors package's limit too; dtrain's headers are a few KB.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr std::string_view kPlainPrefix = "crc32:", kIndexPrefix = "crc32-index:";

// One tensor's entry in a safetensors header.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  ///< byte offsets in the data section
};

uLong crc_update(uLong crc, const char* data, size_t size) {
  for (size_t done = 0; done < size;) {  // crc32 takes at most uInt bytes at a time
    uInt chunk = static_cast<uInt>(std::min<size_t>(size - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data + done), chunk);
    done += chunk;
  }
  return crc;
}

// The "checksum" value of scope (docs/design.md#checkpoint-format): "key=value\n" of every other
// metadata entry in key order; for kIndexToo then "<name length>:<name>\tF32\t[<shape>]\t<begin>
// \t<end>\n" per tensor in name order; then the data section.
std::string checksum_of(ChecksumScope scope, const std::map<std::string, std::string>& metadata,
                        std::vector<TensorEntry> index, const char* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [key, value] : metadata) {
    if (key == "checksum") continue;
    std::string entry = key + "=" + value + "\n";
    crc = crc_update(crc, entry.data(), entry.size());
  }
  if (scope == ChecksumScope::kIndexToo) {
    std::sort(index.begin(), index.end(),
              [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
    for (const TensorEntry& t : index) {
      std::string entry = fmt::format("{}:{}\tF32\t[{}]\t{}\t{}\n", t.name.size(), t.name,
                                      fmt::join(t.shape, ","), t.begin, t.end);
      crc = crc_update(crc, entry.data(), entry.size());
    }
  }
  crc = crc_update(crc, data, size);
  std::string_view prefix = scope == ChecksumScope::kIndexToo ? kIndexPrefix : kPlainPrefix;
  return fmt::format("{}{:08x}", prefix, static_cast<uint32_t>(crc));
}

}  // namespace

std::string encode_safetensors(const std::vector<TensorView>& tensors,
                               std::map<std::string, std::string> metadata, ChecksumScope scope) {
  std::string data;
  std::vector<TensorEntry> index;
  for (const TensorView& t : tensors) {
    index.push_back({t.name, t.shape, data.size(), data.size() + t.count * sizeof(float)});
    data.append(reinterpret_cast<const char*>(t.data), t.count * sizeof(float));
  }
  metadata["checksum"] = checksum_of(scope, metadata, index, data.data(), data.size());
  common::JsonWriter w;
  w.begin_object().key("__metadata__").begin_object();
  for (const auto& [key, value] : metadata) w.key(key).value(value);
  w.end_object();
  for (const TensorEntry& t : index) {
    w.key(t.name).begin_object().key("dtype").value("F32").key("shape").begin_array();
    for (int64_t d : t.shape) w.value(d);
    w.end_array().key("data_offsets").begin_array().value(static_cast<uint64_t>(t.begin));
    w.value(static_cast<uint64_t>(t.end)).end_array().end_object();
  }
  std::string header = w.end_object().str();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(length >> (8 * i));
  return out + header + data;
}

namespace {

// A parsed header: what the data section must hold.
struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> tensors;
  size_t data_end = 0;      ///< the largest end offset: the data section's size, as promised
  uint64_t data_start = 0;  ///< where the data section begins in the file
};

TensorEntry tensor_entry(const std::string& name, const common::JsonNode& node) {
  if (node.at("dtype").as_string() != "F32") node.fail("only F32 tensors are supported");
  TensorEntry t{name, {}, 0, 0};
  uint64_t elements = 1;
  for (const common::JsonNode& d : node.at("shape").as_array()) {
    t.shape.push_back(d.as_int(0, int64_t{1} << 40));
    elements *= static_cast<uint64_t>(t.shape.back());
    if (elements > (uint64_t{1} << 40)) node.fail("shape has more than 2^40 elements");
  }
  std::vector<common::JsonNode> offsets = node.at("data_offsets").as_array();
  if (offsets.size() != 2) node.fail("data_offsets must be [begin, end]");
  t.begin = static_cast<size_t>(offsets[0].as_int(0, int64_t{1} << 50));
  t.end = static_cast<size_t>(offsets[1].as_int(0, int64_t{1} << 50));
  if (t.end < t.begin || t.end - t.begin != elements * sizeof(float)) node.fail("bad data_offsets");
  return t;
}

Header parse_header(std::string_view text, const std::string& path) {
  Header header;
  try {
    common::JsonDocument doc = common::JsonDocument::parse(text, path);
    for (const auto& [name, node] : doc.root().as_object()) {
      if (name == "__metadata__") {
        for (const auto& [key, value] : node.as_object()) header.metadata[key] = value.as_string();
        continue;
      }
      header.tensors.push_back(tensor_entry(name, node));
      header.data_end = std::max(header.data_end, header.tensors.back().end);
    }
  } catch (const common::ConfigError& e) {
    throw common::IoError(fmt::format("{}: bad header: {}", path, e.what()));
  }
  return header;
}

// The tensors' byte ranges must tile the data section, as encode_safetensors lays them out: in
// offset order each begins where the one before ends, the first at 0 and the last at data_size.
// So no two tensors share bytes and none reaches past the data, whatever the checksum says.
void check_layout(std::vector<TensorEntry> tensors, size_t data_size, const std::string& path) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  size_t at = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& t : tensors) {
    if (t.end > data_size) {
      throw common::IoError(
          fmt::format("{}: bad header: tensor {}'s data_offsets go to byte {}, the data has {}",
                      path, t.name, t.end, data_size));
    }
    if (t.begin < at) {
      throw common::IoError(fmt::format(
          "{}: bad header: tensor {}'s data_offsets [{}, {}] overlap tensor {}'s [{}, {}]", path,
          t.name, t.begin, t.end, previous->name, previous->begin, previous->end));
    }
    if (t.begin > at) {
      throw common::IoError(fmt::format(
          "{}: bad header: bytes {} to {} of the data belong to no tensor", path, at, t.begin));
    }
    at = t.end;
    previous = &t;
  }
  if (at != data_size) {
    throw common::IoError(fmt::format(
        "{}: bad header: bytes {} to {} of the data belong to no tensor", path, at, data_size));
  }
}

// The tensors of header from the data section, once its layout and checksum check out.
SafetensorsFile assemble(Header header, const char* data, size_t data_size,
                         const std::string& path) {
  check_layout(header.tensors, data_size, path);
  const std::string& found = header.metadata["checksum"];
  ChecksumScope scope = found.rfind(kIndexPrefix, 0) == 0 ? ChecksumScope::kIndexToo
                                                          : ChecksumScope::kMetadataAndData;
  std::string expected = checksum_of(scope, header.metadata, header.tensors, data, data_size);
  if (found != expected) {
    throw common::IoError(
        fmt::format("{}: checksum mismatch (file says {}, data gives {})", path, found, expected));
  }
  SafetensorsFile file;
  file.checksum_scope = scope;
  for (const TensorEntry& e : header.tensors) {
    Tensor t{e.shape, std::vector<float>((e.end - e.begin) / sizeof(float))};
    std::memcpy(t.data.data(), data + e.begin, e.end - e.begin);
    file.tensors[e.name] = std::move(t);
  }
  file.metadata = std::move(header.metadata);
  return file;
}

uint64_t header_length(const char* first8) {
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(first8[i])) << (8 * i);
  return length;
}

// The header of the file at path, read without its data section.
Header read_header(int fd, uint64_t size, const std::string& path) {
  if (size < 8) throw common::IoError(fmt::format("{}: truncated ({} bytes)", path, size));
  uint64_t length = header_length(common::read_exactly(fd, 8, path).data());
  if (length > size - 8 || length > kMaxHeaderBytes) {
    throw common::IoError(fmt::format("{}: truncated header ({} bytes announced, {} in the file)",
                                      path, length, size - 8));
  }
  Header header = parse_header(common::read_exactly(fd, static_cast<size_t>(length), path), path);
  header.data_start = 8 + length;
  return header;
}

}  // namespace

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8)
    throw common::IoError(fmt::format("{}: truncated ({} bytes)", path, bytes.size()));
  uint64_t length = header_length(bytes.data());
  if (length > bytes.size() - 8) throw common::IoError(fmt::format("{}: truncated header", path));
  Header header = parse_header(std::string_view(bytes.data() + 8, length), path);
  return assemble(std::move(header), bytes.data() + 8 + length, bytes.size() - 8 - length, path);
}

SafetensorsFile read_safetensors(const std::string& path) {
  uint64_t size = 0;
  common::UniqueFd fd = common::open_regular_file(path, &size);
  Header header = read_header(fd.get(), size, path);
  uint64_t data_size = size - header.data_start;
  if (data_size != header.data_end) {  // the header promises the data section's size exactly
    throw common::IoError(fmt::format("{}: the header describes {} bytes of data, the file has {}",
                                      path, header.data_end, data_size));
  }
  std::string data = common::read_exactly(fd.get(), header.data_end, path);
  return assemble(std::move(header), data.data(), data.size(), path);
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  uint64_t size = 0;
  common::UniqueFd fd = common::open_regular_file(path, &size);
  return read_header(fd.get(), size, path).metadata;
}

}  // namespace dtrain::train
