// See data_config.h. Reads JSON only: no file is looked at here (the worker's data library opens
// them when the data is loaded).
#include "worker/spec/data_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "common/errors.h"

namespace dtrain::data {
namespace {

using common::JsonNode;

constexpr int64_t kMaxSyntheticExamples = 10000000;
constexpr int kMaxClasses = 100000;
constexpr int kMaxImageSide = 16384;

// The sources each source-specific key of `train.data` belongs to, separated by spaces.
struct KeyOwner {
  std::string_view key, sources;
};
constexpr KeyOwner kSourceKeys[] = {
    {"dir", "idx"},
    {"train_images", "idx npy"},
    {"train_labels", "idx npy"},
    {"test_images", "idx npy"},
    {"test_labels", "idx npy"},
    {"path", "npz text tokens"},
    {"x_train", "npz"},
    {"y_train", "npz"},
    {"x_test", "npz"},
    {"y_test", "npz"},
    {"examples", "synthetic"},
    {"classes", "synthetic"},
    {"train_dir", "directory"},
    {"test_dir", "directory"},
    {"class_names", "directory"},
    {"color_mode", "directory"},
    {"image_size", "directory"},
    {"seed", "directory"},
    {"sequence_length", "text tokens"},
    {"vocabulary", "text"},
    {"vocabulary_size", "tokens"},
    {"validation_path", "tokens"},
};

bool owns(std::string_view sources, std::string_view source) {
  while (!sources.empty()) {
    size_t space = sources.find(' ');
    if (sources.substr(0, space) == source) return true;
    if (space == std::string_view::npos) break;
    sources.remove_prefix(space + 1);
  }
  return false;
}

// "\"npz\"", "\"idx\" or \"npy\"", "\"npz\", \"text\" or \"tokens\"".
std::string source_list(std::string_view sources) {
  std::vector<std::string> names;
  while (!sources.empty()) {
    size_t space = sources.find(' ');
    names.push_back(fmt::format("\"{}\"", sources.substr(0, space)));
    if (space == std::string_view::npos) break;
    sources.remove_prefix(space + 1);
  }
  std::string text = names.front();
  for (size_t i = 1; i < names.size(); ++i)
    text += (i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

// Throws for the first key present in node that does not belong to source.
void reject_other_keys(const JsonNode& node, const std::string& source) {
  for (const KeyOwner& owner : kSourceKeys) {
    if (owns(owner.sources, source)) continue;
    if (auto n = node.find(owner.key))
      n->fail(fmt::format("only used with \"source\": {}", source_list(owner.sources)));
  }
}

void read_string(const JsonNode& node, std::string_view key, std::string& out) {
  if (auto n = node.find(key)) out = n->as_nonempty_string();
}

std::vector<std::string> read_names(const JsonNode& node) {
  if (!node.is_array())
    node.fail(fmt::format("expected a list of names, found {}", node.describe()));
  std::vector<std::string> names;
  for (const JsonNode& name : node.as_array()) {
    names.push_back(name.as_nonempty_string());
    const std::string& text = names.back();
    // "." is train_dir itself and ".." its parent: a class name is one folder below it.
    if (text == "." || text == ".." || text.find_first_of(std::string("/\0", 2)) != text.npos) {
      name.fail(
          fmt::format("\"{}\" is not the name of a folder in train_dir (\".\", \"..\" "
                      "and names holding \"/\" are not)",
                      text));
    }
    if (std::find(names.begin(), names.end() - 1, text) != names.end() - 1)
      name.fail(fmt::format("class \"{}\" is given twice", text));
  }
  return names;
}

void read_image_size(const JsonNode& node, DataConfig& config) {
  if (!node.is_array() || node.as_array().size() != 2)
    node.fail(fmt::format("expected [height, width], found {}", node.describe()));
  config.image_height = static_cast<int>(node.as_array()[0].as_int(1, kMaxImageSide));
  config.image_width = static_cast<int>(node.as_array()[1].as_int(1, kMaxImageSide));
}

// The directory keys (train_dir, test_dir, class_names, color_mode, image_size, seed) and the keys
// of every file source (validation_split, shard_policy).
void parse_folder_keys(const JsonNode& node, DataConfig& config) {
  for (auto [key, field] :
       {std::pair{"train_dir", &config.train_dir}, {"test_dir", &config.test_dir}})
    if (auto n = node.find(key)) *field = n->as_nonempty_string();
  if (auto n = node.find("class_names")) config.class_names = read_names(*n);
  if (auto n = node.find("color_mode")) {
    config.color_mode = n->as_nonempty_string();
    if (config.color_mode != "grayscale" && config.color_mode != "rgb" &&
        config.color_mode != "rgba") {
      n->fail(fmt::format("expected \"grayscale\", \"rgb\" or \"rgba\", found \"{}\"",
                          config.color_mode));
    }
  }
  if (auto n = node.find("image_size")) read_image_size(*n, config);
  if (auto n = node.find("seed"))
    config.split_seed = static_cast<uint64_t>(n->as_int(0, int64_t{1} << 53));
  if (auto n = node.find("validation_split")) {
    config.validation_split = n->as_number(0, 1);
    if (config.validation_split <= 0 || config.validation_split >= 1)
      n->fail(fmt::format("expected a fraction between 0 and 1, found {}", n->describe()));
    if (config.source == "synthetic")
      n->fail("not used with \"source\": \"synthetic\" (it has its own test split)");
    if (node.find("test_dir")) n->fail("give test_dir or validation_split, not both");
  }
  if (auto n = node.find("shard_policy")) {
    config.shard_policy = n->as_nonempty_string();
    if (config.shard_policy != "data" && config.shard_policy != "file")
      n->fail(fmt::format("expected \"data\" or \"file\", found \"{}\"", config.shard_policy));
    if (config.shard_policy == "file" && config.source == "synthetic")
      n->fail("\"file\" shards files: \"source\": \"synthetic\" has none");
  }
  if (config.source == "directory" && config.train_dir.empty())
    node.fail("\"source\": \"directory\" needs \"train_dir\"");
}

// The keys of "text" and "tokens" (reject_other_keys has refused the other source's).
void parse_text_keys(const JsonNode& node, DataConfig& config) {
  const std::string& source = config.source;
  if (config.path.empty()) node.fail(fmt::format("\"source\": \"{}\" needs \"path\"", source));
  if (auto n = node.find("sequence_length"))
    config.sequence_length = static_cast<int>(n->as_int(1, 1 << 14));
  if (auto n = node.find("vocabulary")) {
    config.vocabulary = n->as_nonempty_string();
    if (config.vocabulary != "characters" && config.vocabulary != "bytes")
      n->fail(fmt::format("expected \"characters\" or \"bytes\", found \"{}\"", config.vocabulary));
  }
  if (source == "tokens") {
    auto n = node.find("vocabulary_size");
    if (!n) node.fail("\"source\": \"tokens\" needs \"vocabulary_size\" (every id is below it)");
    config.vocabulary_size = static_cast<int>(n->as_int(2, 65536));
    read_string(node, "validation_path", config.validation_path);
  }
  if (auto n = node.find("shard_policy"); n && config.shard_policy == "file")
    n->fail("\"file\" shards files of examples: a text source has one corpus");
  if (auto n = node.find("validation_split"); n && !config.validation_path.empty())
    n->fail("give validation_path or validation_split, not both");
  if (!node.find("validation_split") && config.validation_path.empty())
    config.validation_split = 0.1;
}

}  // namespace

DataConfig parse_data_config(const JsonNode& node) {
  node.check_keys({"source",         "dir",
                   "train_images",   "train_labels",
                   "test_images",    "test_labels",
                   "path",           "x_train",
                   "y_train",        "x_test",
                   "y_test",         "examples",
                   "classes",        "train_dir",
                   "test_dir",       "class_names",
                   "color_mode",     "image_size",
                   "seed",           "validation_split",
                   "shard_policy",   "sequence_length",
                   "vocabulary",     "vocabulary_size",
                   "validation_path"});
  DataConfig config;
  if (auto n = node.find("source")) config.source = n->as_string();
  const std::string& source = config.source;
  if (source != "idx" && source != "npz" && source != "npy" && source != "directory" &&
      source != "synthetic" && source != "text" && source != "tokens") {
    node.at("source").fail(
        fmt::format("unknown data source \"{}\" (expected \"idx\", \"npz\", \"npy\", "
                    "\"directory\", \"synthetic\", \"text\" or \"tokens\")",
                    source));
  }
  reject_other_keys(node, source);
  if (auto n = node.find("examples")) config.examples = n->as_int(1, kMaxSyntheticExamples);
  if (auto n = node.find("classes")) config.classes = static_cast<int>(n->as_int(2, kMaxClasses));
  for (auto [key, field] : {std::pair{"dir", &config.dir},
                            {"train_images", &config.train_images},
                            {"train_labels", &config.train_labels},
                            {"test_images", &config.test_images},
                            {"test_labels", &config.test_labels},
                            {"path", &config.path},
                            {"x_train", &config.x_train},
                            {"y_train", &config.y_train},
                            {"x_test", &config.x_test},
                            {"y_test", &config.y_test}}) {
    read_string(node, key, *field);
  }
  parse_folder_keys(node, config);
  if (source == "text" || source == "tokens") parse_text_keys(node, config);
  if (source == "npz" && config.path.empty()) node.fail("\"source\": \"npz\" needs \"path\"");
  if (source == "npy" && (config.train_images.empty() || config.train_labels.empty()))
    node.fail("\"source\": \"npy\" needs \"train_images\" and \"train_labels\"");
  return config;
}

}  // namespace dtrain::data
