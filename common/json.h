// JSON reading with paths, and JSON writing: the only files that see RapidJSON.
// JsonNode turns every type or range mistake into a ConfigError that names the JSON path
// ("cluster.worker[1]: expected a string, found 12"); it does not know any dtrain schema.
#pragma once

#include <rapidjson/document.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::common {

/// A read-only view of one value in a parsed document, with its path from the root.
/// Cheap to copy; valid while the JsonDocument it came from lives.
class JsonNode {
 public:
  JsonNode(const rapidjson::Value* value, std::string path);

  /// "cluster.worker[1]"; "" for the root (shown as "top level" in messages).
  const std::string& path() const { return path_; }
  /// Path for messages: the path, or "top level".
  std::string where() const;

  bool is_object() const { return value_->IsObject(); }
  bool is_array() const { return value_->IsArray(); }
  bool is_string() const { return value_->IsString(); }
  bool is_null() const { return value_->IsNull(); }

  /// Each of these throws ConfigError "<path>: expected ..., found ..." on a mismatch.
  std::string as_string() const;
  std::string as_nonempty_string() const;
  int64_t as_int(int64_t min, int64_t max) const;
  double as_number(double min, double max) const;
  bool as_bool() const;
  std::vector<JsonNode> as_array() const;
  /// Object members in document order.
  std::vector<std::pair<std::string, JsonNode>> as_object() const;

  /// Member of an object (ConfigError if this is not an object); nullopt when absent.
  std::optional<JsonNode> find(std::string_view key) const;
  /// Member that must be present.
  JsonNode at(std::string_view key) const;
  /// Throws ConfigError naming the first key not in allowed, and listing the allowed ones.
  void check_keys(std::initializer_list<std::string_view> allowed) const;

  /// Compact JSON text of this value.
  std::string dump() const;
  /// Short description for messages: "12", "\"localhost\"", "an object", "an array of 3".
  std::string describe() const;

  /// ConfigError "<path>: <message>".
  [[noreturn]] void fail(const std::string& message) const;

 private:
  const rapidjson::Value* value_;
  std::string path_;
};

/// Deepest nesting of arrays and objects that parse() accepts. dtrain's own documents nest fewer
/// than 10 levels; the limit keeps hostile text (a job file, TF_CONFIG, a checkpoint header, a
/// control line) from costing stack or memory out of proportion to its size.
inline constexpr size_t kMaxJsonDepth = 64;

/// An owned, parsed JSON document. Parsing is strict: valid UTF-8, no trailing content, no
/// duplicate keys, no NaN, at most kMaxJsonDepth levels of nesting; errors are ConfigError
/// "<source>: line L, column C: <reason>". Parsing is iterative: its stack use does not depend on
/// the text, and its memory is proportional to the text's length.
class JsonDocument {
 public:
  static JsonDocument parse(std::string_view text, const std::string& source);
  JsonNode root() const { return JsonNode(doc_.get(), ""); }

 private:
  explicit JsonDocument(std::shared_ptr<rapidjson::Document> doc) : doc_(std::move(doc)) {}
  std::shared_ptr<rapidjson::Document> doc_;
};

/// JSON string literal for text, with quotes and escapes ("a\"b").
std::string json_quote(std::string_view text);

/// Builds compact JSON text; each value call appends one value, key() names the next one.
/// Misuse (a value in an object without a key) is an EnforceError.
class JsonWriter {
 public:
  JsonWriter();
  ~JsonWriter();
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view name);
  JsonWriter& value(std::string_view text);
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  JsonWriter& value(int64_t number);
  JsonWriter& value(int number) { return value(static_cast<int64_t>(number)); }
  JsonWriter& value(uint64_t number);
  JsonWriter& value(double number);
  JsonWriter& value(bool flag);
  JsonWriter& null();
  /// Inserts already-valid JSON text (e.g. JsonNode::dump()) as one value.
  JsonWriter& raw(std::string_view json);
  /// The text so far; complete once every begin has its end.
  std::string str() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::common
