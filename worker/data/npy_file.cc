// See npy_file.h. The header dict is a Python literal; this parses only the subset NumPy writes
// (string keys; string, True/False and integer-tuple values) and refuses the rest. Sizes are
// checked against the bytes really present before anything more is allocated.
#include "worker/data/npy_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>

#include "common/errors.h"
#include "common/file_bytes.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npy data is read as little-endian");

namespace dtrain::data {
namespace {

using common::ConfigError;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", where, what));
}

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
constexpr uint64_t kMaxDim = uint64_t{1} << 62;

struct DtypeName {
  const char* descr;
  NpyDtype dtype;
};
constexpr DtypeName kDtypes[] = {
    {"|u1", NpyDtype::kUint8},  {"<u1", NpyDtype::kUint8},   {"|i1", NpyDtype::kInt8},
    {"<i1", NpyDtype::kInt8},   {"<u2", NpyDtype::kUint16},  {"<i2", NpyDtype::kInt16},
    {"<u4", NpyDtype::kUint32}, {"<i4", NpyDtype::kInt32},   {"<u8", NpyDtype::kUint64},
    {"<i8", NpyDtype::kInt64},  {"<f4", NpyDtype::kFloat32}, {"<f8", NpyDtype::kFloat64},
};

NpyDtype dtype_of(const std::string& descr, const std::string& where, const std::string& expected) {
  for (const DtypeName& d : kDtypes)
    if (descr == d.descr) return d.dtype;
  if (!descr.empty() && descr[0] == '>') {
    fail(where, fmt::format("dtype '{}' is big-endian, which is not supported (save it with "
                            ".astype('<{}'))",
                            descr, descr.substr(1)));
  }
  fail(where, fmt::format("dtype '{}' is not supported ({})", descr, expected));
}

// The subset of Python literals NumPy writes in an .npy header dict.
class DictParser {
 public:
  DictParser(std::string_view text, const std::string& where, const std::string& expected)
      : text_(text), where_(where), expected_(expected) {}

  NpyHeader parse() {
    NpyHeader header;
    bool have_descr = false, have_order = false, have_shape = false, fortran = false;
    expect('{');
    while (!accept('}')) {
      std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        skip_space();
        if (peek() == '[') bad("descr is a list: structured dtypes are not supported");
        header.descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_order = true;
      } else if (key == "shape") {
        header.shape = tuple();
        have_shape = true;
      } else {
        bad(fmt::format("unknown key '{}' in the header dict", key));
      }
      if (!accept(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) bad("unexpected text after the header dict");
    if (!have_descr || !have_order || !have_shape)
      bad("the header dict needs 'descr', 'fortran_order' and 'shape'");
    header.dtype = dtype_of(header.descr, where_, expected_);
    if (fortran && std::count_if(header.shape.begin(), header.shape.end(),
                                 [](int64_t d) { return d > 1; }) > 1) {
      bad("fortran_order is True, which is not supported (save np.ascontiguousarray(a))");
    }
    return header;
  }

 private:
  [[noreturn]] void bad(const std::string& what) { fail(where_, "bad .npy header: " + what); }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n')) ++pos_;
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool accept(char c) {
    skip_space();
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!accept(c)) bad(fmt::format("expected '{}' at byte {} of the dict", c, pos_));
  }
  std::string string_literal() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad(fmt::format("expected a string at byte {}", pos_));
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    if (value.find('\\') != std::string::npos) bad("escapes in strings are not supported");
    pos_ = end + 1;
    return value;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_, std::strlen(word)) == word) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    bad("fortran_order must be True or False");
  }
  int64_t integer() {
    skip_space();
    uint64_t value = 0;
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      value = value * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
      if (value > kMaxDim) bad("a dimension of the shape is too large");
    }
    if (pos_ == start) bad(fmt::format("expected a dimension at byte {}", pos_));
    if (peek() == 'L') ++pos_;  // Python 2's long
    return static_cast<int64_t>(value);
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (!accept(')')) {
      if (dims.size() >= 32) bad("the shape has more than 32 dimensions");
      dims.push_back(integer());
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }

  std::string_view text_;
  const std::string& where_;
  const std::string& expected_;
  size_t pos_ = 0;
};

uint32_t little_endian(const uint8_t* bytes, int n) {
  uint32_t value = 0;
  for (int i = n - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

std::string read_exactly(ByteReader& in, size_t n, const std::string& where, const char* what) {
  std::string bytes(n, '\0');
  size_t got = in.read(reinterpret_cast<uint8_t*>(bytes.data()), n);
  if (got < n) fail(where, fmt::format("truncated {}: needs {} bytes, has {}", what, n, got));
  return bytes;
}

}  // namespace

int npy_itemsize(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kUint8:
    case NpyDtype::kInt8:
      return 1;
    case NpyDtype::kUint16:
    case NpyDtype::kInt16:
      return 2;
    case NpyDtype::kUint32:
    case NpyDtype::kInt32:
    case NpyDtype::kFloat32:
      return 4;
    case NpyDtype::kUint64:
    case NpyDtype::kInt64:
    case NpyDtype::kFloat64:
      return 8;
  }
  return 0;
}

bool npy_is_integer(NpyDtype dtype) {
  return dtype != NpyDtype::kFloat32 && dtype != NpyDtype::kFloat64;
}

size_t MemoryReader::read(uint8_t* out, size_t n) {
  const size_t take = static_cast<size_t>(std::min<uint64_t>(n, size_ - position_));
  if (take > 0) std::memcpy(out, data_ + position_, take);
  position_ += take;
  return take;
}

NpyHeader read_npy_header(ByteReader& in, uint64_t total_bytes, const std::string& where,
                          const std::string& expected) {
  const std::string start = read_exactly(in, kMagicBytes + 2, where, ".npy header");
  if (start.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0)
    fail(where, "not an .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<uint8_t>(start[6]), minor = static_cast<uint8_t>(start[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(where,
         fmt::format(".npy format version {}.{} is not supported (1.0 to 3.0)", major, minor));
  const int length_bytes = major == 1 ? 2 : 4;
  const std::string length = read_exactly(in, length_bytes, where, ".npy header");
  const uint64_t dict_bytes =
      little_endian(reinterpret_cast<const uint8_t*>(length.data()), length_bytes);
  const uint64_t offset = kMagicBytes + 2 + length_bytes + dict_bytes;
  if (dict_bytes > kMaxNpyHeaderBytes)
    fail(where, fmt::format("the .npy header claims {} bytes (at most {})", dict_bytes,
                            kMaxNpyHeaderBytes));
  if (offset > total_bytes)
    fail(where, fmt::format("truncated .npy header: needs {} bytes, has {}", offset, total_bytes));
  const std::string dict = read_exactly(in, static_cast<size_t>(dict_bytes), where, ".npy header");
  NpyHeader header = DictParser(dict, where, expected).parse();
  header.data_offset = offset;
  const uint64_t available = total_bytes - offset;
  const uint64_t itemsize = static_cast<uint64_t>(npy_itemsize(header.dtype));
  uint64_t bytes = itemsize;
  bool overflow = false;
  for (int64_t dim : header.shape)
    overflow = __builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes) || overflow;
  if (std::find(header.shape.begin(), header.shape.end(), 0) != header.shape.end()) {
    bytes = 0;
    overflow = false;
  }
  const std::string shape =
      fmt::format("({}{})", fmt::join(header.shape, ", "), header.shape.size() == 1 ? "," : "");
  if (overflow || bytes > available) {
    fail(where,
         fmt::format("truncated: shape {} of '{}' needs {} bytes of data, has {}", shape,
                     header.descr, overflow ? "more than 2^64" : std::to_string(bytes), available));
  }
  if (bytes < available) {
    fail(where, fmt::format("trailing bytes: shape {} of '{}' needs {} bytes of data, has {}",
                            shape, header.descr, bytes, available));
  }
  header.data_bytes = bytes;
  header.count = static_cast<int64_t>(bytes / itemsize);  // 0 when a dimension is 0
  return header;
}

NpyArray read_npy(const std::string& path, const std::string& expected) {
  auto file = std::make_shared<common::FileBytes>(path);
  MemoryReader in(file->data(), file->size());
  NpyHeader header = read_npy_header(in, file->size(), path, expected);
  NpyArray array{header.descr, header.dtype, header.shape,
                 header.count, nullptr,      header.data_bytes};
  array.data = std::shared_ptr<const uint8_t>(file, file->data() + header.data_offset);
  return array;
}

}  // namespace dtrain::data
