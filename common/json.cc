// RapidJSON behind json.h: strict parsing with line/column errors, path-aware access, writing.
#include "common/json.h"

#include <rapidjson/encodedstream.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>

#include "common/errors.h"

namespace dtrain::common {
namespace {

std::string child_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : fmt::format("{}.{}", parent, key);
}

std::string index_path(const std::string& parent, size_t index) {
  return fmt::format("{}[{}]", parent, index);
}

// Line and column (1-based) of a byte offset, for parse errors.
std::pair<size_t, size_t> line_column(std::string_view text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

// Deepest nesting of arrays and objects in text, counted without recursion or allocation, and
// where it first goes past limit (or npos). Brackets inside strings do not count; text that is not
// JSON may count wrong, but then the parser refuses it anyway.
size_t first_offset_deeper_than(std::string_view text, size_t limit) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

// Sits between RapidJSON 1.1.0 (Debian 12) and the document, for two of its faults found by the
// fuzz targets (test/fuzz):
// - Numbers: its full-precision conversion misreads a zero spelled "0e90" or "0.000...0" and an
//   integer just past 2^64 (its DiyFp::Normalize takes __builtin_clzll(0)), and reads past its
//   table of powers for long mantissas with large exponents. So the reader hands numbers over as
//   text (kParseNumbersAsStringsFlag) and they are converted here with std::from_chars, which
//   rounds correctly.
// - Strings: it decodes a lone low surrogate escape ("\udc00") into bytes that are not UTF-8,
//   which the document then carries into files that no longer parse (spec.json). Refused here.
template <typename Handler>
class StrictValues {
 public:
  explicit StrictValues(Handler& to) : to_(to) {}
  bool Null() { return to_.Null(); }
  bool Bool(bool b) { return to_.Bool(b); }
  bool Int(int i) { return to_.Int(i); }
  bool Uint(unsigned u) { return to_.Uint(u); }
  bool Int64(int64_t i) { return to_.Int64(i); }
  bool Uint64(uint64_t u) { return to_.Uint64(u); }
  bool Double(double d) { return to_.Double(d); }
  bool String(const char* s, rapidjson::SizeType n, bool copy) {
    return utf8(s, n) && to_.String(s, n, copy);
  }
  bool StartObject() { return to_.StartObject(); }
  bool Key(const char* s, rapidjson::SizeType n, bool copy) {
    return utf8(s, n) && to_.Key(s, n, copy);
  }
  bool EndObject(rapidjson::SizeType members) { return to_.EndObject(members); }
  bool StartArray() { return to_.StartArray(); }
  bool EndArray(rapidjson::SizeType elements) { return to_.EndArray(elements); }

  /// text is a valid JSON number (the reader checked its grammar).
  bool RawNumber(const char* text, rapidjson::SizeType n, bool) {
    const char* end = text + n;
    if (std::find_if(text, end, [](char c) { return c == '.' || c == 'e' || c == 'E'; }) == end) {
      int64_t i = 0;
      if (std::from_chars(text, end, i).ec == std::errc()) {
        if (i >= INT32_MIN && i <= INT32_MAX) return to_.Int(static_cast<int>(i));
        if (i >= 0 && i <= UINT32_MAX) return to_.Uint(static_cast<unsigned>(i));
        return to_.Int64(i);
      }
      uint64_t u = 0;
      if (std::from_chars(text, end, u).ec == std::errc()) return to_.Uint64(u);
    }
    double d = 0;
    const std::from_chars_result r = std::from_chars(text, end, d);
    if (r.ec == std::errc::result_out_of_range) {
      // Closer to zero than any double: strtod gives 0 or the nearest denormal; too big: inf.
      d = std::strtod(std::string(text, n).c_str(), nullptr);
      if (std::isinf(d)) {
        refusal_ = "Number too big to be stored in double.";
        return false;
      }
    } else if (r.ec != std::errc() || r.ptr != end) {
      return false;
    }
    return to_.Double(d);
  }
  /// Why a value was refused ("" when none was): the reader only knows the handler said no.
  const char* refusal() const { return refusal_; }

 private:
  // The input is valid UTF-8 (checked by the reader), so only a decoded \u escape can put a
  // UTF-16 surrogate (U+D800-U+DFFF: bytes ED A0-BF ..) into a string.
  bool utf8(const char* s, rapidjson::SizeType n) {
    for (rapidjson::SizeType i = 0; i + 1 < n; ++i) {
      if (static_cast<unsigned char>(s[i]) == 0xED &&
          static_cast<unsigned char>(s[i + 1]) >= 0xA0) {
        refusal_ = "a \\u escape names a lone UTF-16 surrogate";
        return false;
      }
    }
    return true;
  }
  Handler& to_;
  const char* refusal_ = "";
};

// One step of the way from the root to a value, kept on the stack while descending, so the path
// text is built only for an error message, not at every level.
struct PathLink {
  const PathLink* parent = nullptr;
  std::string_view key;  ///< the member's key, or empty for an array element
  size_t index = 0;
  bool is_element = false;
};

std::string path_text(const PathLink* link) {
  if (link == nullptr) return "";
  std::string parent = path_text(link->parent);
  return link->is_element ? index_path(parent, link->index) : child_path(parent, link->key);
}

// Recursion is bounded by kMaxJsonDepth: parse() refuses deeper text first.
void check_duplicate_keys(const rapidjson::Value& value, const PathLink* link,
                          const std::string& source) {
  if (value.IsObject()) {
    std::set<std::string_view> seen;
    for (const auto& member : value.GetObject()) {
      std::string_view key(member.name.GetString(), member.name.GetStringLength());
      if (!seen.insert(key).second) {
        std::string path = path_text(link);
        throw ConfigError(fmt::format("{}: {}: key \"{}\" appears more than once", source,
                                      path.empty() ? "top level" : path, key));
      }
      PathLink child{link, key, 0, false};
      check_duplicate_keys(member.value, &child, source);
    }
  } else if (value.IsArray()) {
    for (rapidjson::SizeType i = 0; i < value.Size(); ++i) {
      PathLink element{link, {}, i, true};
      check_duplicate_keys(value[i], &element, source);
    }
  }
}

}  // namespace

JsonNode::JsonNode(const rapidjson::Value* value, std::string path)
    : value_(value), path_(std::move(path)) {}

std::string JsonNode::where() const {
  return path_.empty() ? "top level" : path_;
}

void JsonNode::fail(const std::string& message) const {
  throw ConfigError(fmt::format("{}: {}", where(), message));
}

std::string JsonNode::describe() const {
  if (value_->IsString() || value_->IsNumber() || value_->IsBool() || value_->IsNull()) {
    std::string text = dump();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    return text;
  }
  if (value_->IsArray()) {
    return value_->Empty() ? "an empty array" : fmt::format("an array of {}", value_->Size());
  }
  return value_->ObjectEmpty() ? "an empty object" : "an object";
}

std::string JsonNode::as_string() const {
  if (!value_->IsString()) fail(fmt::format("expected a string, found {}", describe()));
  return std::string(value_->GetString(), value_->GetStringLength());
}

std::string JsonNode::as_nonempty_string() const {
  std::string text = as_string();
  if (text.empty()) fail("expected a non-empty string, found \"\"");
  return text;
}

int64_t JsonNode::as_int(int64_t min, int64_t max) const {
  bool integral = value_->IsInt64() ||
                  (value_->IsDouble() && std::trunc(value_->GetDouble()) == value_->GetDouble() &&
                   std::fabs(value_->GetDouble()) < 9e15);
  if (!integral) fail(fmt::format("expected an integer, found {}", describe()));
  int64_t number =
      value_->IsInt64() ? value_->GetInt64() : static_cast<int64_t>(value_->GetDouble());
  if (number < min || number > max) {
    fail(fmt::format("expected an integer from {} to {}, found {}", min, max, number));
  }
  return number;
}

double JsonNode::as_number(double min, double max) const {
  if (!value_->IsNumber()) fail(fmt::format("expected a number, found {}", describe()));
  double number = value_->GetDouble();
  if (number < min || number > max) {
    fail(fmt::format("expected a number from {} to {}, found {}", min, max, describe()));
  }
  return number;
}

bool JsonNode::as_bool() const {
  if (!value_->IsBool()) fail(fmt::format("expected true or false, found {}", describe()));
  return value_->GetBool();
}

std::vector<JsonNode> JsonNode::as_array() const {
  if (!value_->IsArray()) fail(fmt::format("expected an array, found {}", describe()));
  std::vector<JsonNode> items;
  items.reserve(value_->Size());
  for (rapidjson::SizeType i = 0; i < value_->Size(); ++i) {
    items.emplace_back(&(*value_)[i], index_path(path_, i));
  }
  return items;
}

std::vector<std::pair<std::string, JsonNode>> JsonNode::as_object() const {
  if (!value_->IsObject()) fail(fmt::format("expected an object, found {}", describe()));
  std::vector<std::pair<std::string, JsonNode>> members;
  for (const auto& member : value_->GetObject()) {
    std::string key(member.name.GetString(), member.name.GetStringLength());
    members.emplace_back(key, JsonNode(&member.value, child_path(path_, key)));
  }
  return members;
}

std::optional<JsonNode> JsonNode::find(std::string_view key) const {
  if (!value_->IsObject()) fail(fmt::format("expected an object, found {}", describe()));
  rapidjson::Value name(rapidjson::StringRef(key.data(), key.size()));
  auto it = value_->FindMember(name);
  if (it == value_->MemberEnd()) return std::nullopt;
  return JsonNode(&it->value, child_path(path_, key));
}

JsonNode JsonNode::at(std::string_view key) const {
  std::optional<JsonNode> node = find(key);
  if (!node) fail(fmt::format("missing required key \"{}\"", key));
  return *node;
}

void JsonNode::check_keys(std::initializer_list<std::string_view> allowed) const {
  for (const auto& [key, node] : as_object()) {
    bool known = false;
    for (std::string_view name : allowed) known = known || name == key;
    if (!known) {
      std::string names;
      for (std::string_view name : allowed)
        names += fmt::format("{}{}", names.empty() ? "" : ", ", name);
      fail(fmt::format("unknown key \"{}\" (expected one of: {})", key, names));
    }
  }
}

std::string JsonNode::dump() const {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
  value_->Accept(writer);
  return std::string(buffer.GetString(), buffer.GetSize());
}

JsonDocument JsonDocument::parse(std::string_view text, const std::string& source) {
  if (size_t at = first_offset_deeper_than(text, kMaxJsonDepth); at != std::string_view::npos) {
    auto [line, column] = line_column(text, at);
    throw ConfigError(fmt::format("{}: line {}, column {}: nested more than {} levels deep", source,
                                  line, column, kMaxJsonDepth));
  }
  auto doc = std::make_shared<rapidjson::Document>();
  // Iterative: the parser's own stack is on the heap, bounded by the depth checked above.
  constexpr unsigned kFlags = rapidjson::kParseValidateEncodingFlag |
                              rapidjson::kParseNumbersAsStringsFlag |
                              rapidjson::kParseIterativeFlag;
  rapidjson::ParseResult result;
  const char* refusal = "";
  auto generate = [&](rapidjson::Document& into) {
    StrictValues<rapidjson::Document> strict(into);
    rapidjson::MemoryStream bytes(text.data(), text.size());
    rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> in(bytes);
    result = rapidjson::Reader().Parse<kFlags>(in, strict);
    refusal = strict.refusal();
    return !result.IsError();
  };
  doc->Populate(generate);
  if (result.IsError()) {
    auto [line, column] = line_column(text, result.Offset());
    throw ConfigError(fmt::format("{}: line {}, column {}: invalid JSON: {}", source, line, column,
                                  *refusal ? refusal : rapidjson::GetParseError_En(result.Code())));
  }
  check_duplicate_keys(*doc, nullptr, source);
  return JsonDocument(std::move(doc));
}

std::string json_quote(std::string_view text) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
  writer.String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
  return std::string(buffer.GetString(), buffer.GetSize());
}

struct JsonWriter::Impl {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer{buffer};
};

JsonWriter::JsonWriter() : impl_(std::make_unique<Impl>()) {}
JsonWriter::~JsonWriter() = default;

JsonWriter& JsonWriter::begin_object() {
  DT_ENFORCE(impl_->writer.StartObject());
  return *this;
}
JsonWriter& JsonWriter::end_object() {
  DT_ENFORCE(impl_->writer.EndObject());
  return *this;
}
JsonWriter& JsonWriter::begin_array() {
  DT_ENFORCE(impl_->writer.StartArray());
  return *this;
}
JsonWriter& JsonWriter::end_array() {
  DT_ENFORCE(impl_->writer.EndArray());
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  DT_ENFORCE(impl_->writer.Key(name.data(), static_cast<rapidjson::SizeType>(name.size())));
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view text) {
  DT_ENFORCE(impl_->writer.String(text.data(), static_cast<rapidjson::SizeType>(text.size())));
  return *this;
}

JsonWriter& JsonWriter::value(int64_t number) {
  DT_ENFORCE(impl_->writer.Int64(number));
  return *this;
}
JsonWriter& JsonWriter::value(uint64_t number) {
  DT_ENFORCE(impl_->writer.Uint64(number));
  return *this;
}
JsonWriter& JsonWriter::value(bool flag) {
  DT_ENFORCE(impl_->writer.Bool(flag));
  return *this;
}
JsonWriter& JsonWriter::null() {
  DT_ENFORCE(impl_->writer.Null());
  return *this;
}

JsonWriter& JsonWriter::value(double number) {
  // JSON has no NaN or infinity; write null so readers still parse the line.
  if (!std::isfinite(number)) return null();
  DT_ENFORCE(impl_->writer.Double(number));
  return *this;
}

JsonWriter& JsonWriter::raw(std::string_view json) {
  DT_ENFORCE(impl_->writer.RawValue(json.data(), json.size(), rapidjson::kObjectType));
  return *this;
}

std::string JsonWriter::str() const {
  return std::string(impl_->buffer.GetString(), impl_->buffer.GetSize());
}

}  // namespace dtrain::common
