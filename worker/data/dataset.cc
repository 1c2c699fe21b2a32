// See dataset.h. Loading converts bytes to floats once; the config reader only reads JSON and
// never touches files (resolve_idx_paths does, when the data is loaded).
#include "worker/data/dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <type_traits>

#include "common/errors.h"
#include "worker/data/batcher.h"
#include "worker/data/idx_file.h"

namespace dtrain::data {
namespace {

using common::ConfigError;
using common::JsonNode;

constexpr float kSyntheticNoise = 0.1f;  ///< noise is uniform in +-this
constexpr int64_t kMaxSyntheticExamples = 10000000;
constexpr int64_t kMaxSyntheticFloats = int64_t{1} << 28;  ///< 1 GiB of images per split
constexpr int kMaxClasses = 100000;

// Throws for each of keys present in node: they belong to the other source.
void reject_keys(const JsonNode& node, std::initializer_list<std::string_view> keys,
                 const std::string& source) {
  for (std::string_view key : keys) {
    if (auto n = node.find(key)) n->fail(fmt::format("only used with \"source\": \"{}\"", source));
  }
}

std::string shape_text(int height, int width, int channels) {
  return fmt::format("{}x{}x{}", height, width, channels);
}

void check_input_shape(const std::vector<int>& input_shape) {
  bool ok = input_shape.size() == 3;
  for (int dim : input_shape) ok = ok && dim > 0;
  if (!ok) {
    throw ConfigError(fmt::format(
        "model.input_shape must be [height, width, channels] of positive numbers, not [{}]",
        fmt::join(input_shape, ", ")));
  }
}

void check_matches_model(const Dataset& data, const std::vector<int>& input_shape,
                         const std::string& images_path) {
  if (data.height == input_shape[0] && data.width == input_shape[1] &&
      data.channels == input_shape[2]) {
    return;
  }
  throw ConfigError(fmt::format("data: images are {} but model.input_shape is [{}] ({})",
                                shape_text(data.height, data.width, data.channels),
                                fmt::join(input_shape, ", "), images_path));
}

std::pair<Dataset, Dataset> make_synthetic_splits(const DataConfig& config,
                                                  const std::vector<int>& shape) {
  const int64_t test_examples = std::max<int64_t>(config.classes, config.examples / 4);
  int64_t floats = config.examples;
  for (int dim : shape) {
    if (floats > kMaxSyntheticFloats / dim) {
      throw ConfigError(fmt::format("data: {} synthetic examples of {} are more than 1 GiB",
                                    config.examples, shape_text(shape[0], shape[1], shape[2])));
    }
    floats *= dim;
  }
  Dataset train = make_synthetic(config.examples, config.classes, shape[0], shape[1], shape[2],
                                 kSyntheticSeed, 0);
  Dataset test = make_synthetic(test_examples, config.classes, shape[0], shape[1], shape[2],
                                kSyntheticSeed, config.examples);
  return {std::move(train), std::move(test)};
}

}  // namespace

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, Split split) {
  IdxArray images = read_idx(images_path, IdxKind::kImages);
  IdxArray labels = read_idx(labels_path, IdxKind::kLabels);
  if (images.dims[0] != labels.dims[0]) {
    throw ConfigError(fmt::format("{} has {} images but {} has {} labels", images_path,
                                  images.dims[0], labels_path, labels.dims[0]));
  }
  Dataset data;
  data.count = images.dims[0];
  data.height = static_cast<int>(images.dims[1]);
  data.width = static_cast<int>(images.dims[2]);
  data.channels = 1;
  data.bytes = std::move(images.data);
  data.labels.assign(labels.data.begin(), labels.data.end());
  const int32_t largest = *std::max_element(data.labels.begin(), data.labels.end());
  if (largest == 0 && split == Split::kTrain) {
    throw ConfigError(
        fmt::format("{}: all labels are 0; a classifier needs at least 2 classes", labels_path));
  }
  data.classes = largest + 1;
  return data;
}

Dataset make_synthetic(int64_t examples, int classes, int height, int width, int channels,
                       uint64_t seed, int64_t first_index) {
  DT_ENFORCE(examples > 0 && classes >= 2 && height > 0 && width > 0 && channels > 0,
             "make_synthetic({}, {}, {}, {}, {})", examples, classes, height, width, channels);
  const int64_t pixels = int64_t{height} * width * channels;
  std::vector<float> prototypes(static_cast<size_t>(pixels * classes));
  SplitMix64 prototype_rng(derive_seed(seed, 0));
  for (float& value : prototypes) value = prototype_rng.unit_float();

  Dataset data{examples, height, width, channels, classes, {}, {}, {}};
  data.images.resize(static_cast<size_t>(examples * pixels));
  data.labels.resize(static_cast<size_t>(examples));
  const uint64_t example_seed = derive_seed(seed, 1);
  for (int64_t i = 0; i < examples; ++i) {
    const uint64_t index = static_cast<uint64_t>(first_index + i);
    const int32_t label = static_cast<int32_t>(index % static_cast<uint64_t>(classes));
    SplitMix64 noise(derive_seed(example_seed, index));
    const float* prototype = prototypes.data() + label * pixels;
    float* out = data.images.data() + i * pixels;
    for (int64_t p = 0; p < pixels; ++p) {
      float jitter = (2.0f * noise.unit_float() - 1.0f) * kSyntheticNoise;
      out[p] = std::clamp(prototype[p] + jitter, 0.0f, 1.0f);
    }
    data.labels[static_cast<size_t>(i)] = label;
  }
  return data;
}

DataConfig parse_data_config(const JsonNode& node) {
  node.check_keys({"source", "dir", "train_images", "train_labels", "test_images", "test_labels",
                   "examples", "classes"});
  DataConfig config;
  if (auto n = node.find("source")) config.source = n->as_string();
  if (config.source == "synthetic") {
    reject_keys(node, {"dir", "train_images", "train_labels", "test_images", "test_labels"}, "idx");
    if (auto n = node.find("examples")) config.examples = n->as_int(1, kMaxSyntheticExamples);
    if (auto n = node.find("classes")) config.classes = static_cast<int>(n->as_int(2, kMaxClasses));
  } else if (config.source == "idx") {
    reject_keys(node, {"examples", "classes"}, "synthetic");
    if (auto n = node.find("dir")) config.dir = n->as_nonempty_string();
    if (auto n = node.find("train_images")) config.train_images = n->as_nonempty_string();
    if (auto n = node.find("train_labels")) config.train_labels = n->as_nonempty_string();
    if (auto n = node.find("test_images")) config.test_images = n->as_nonempty_string();
    if (auto n = node.find("test_labels")) config.test_labels = n->as_nonempty_string();
  } else {
    node.at("source").fail(fmt::format(
        "unknown data source \"{}\" (expected \"idx\" or \"synthetic\")", config.source));
  }
  return config;
}

DataConfig resolve_idx_paths(const DataConfig& config) {
  DataConfig resolved = config;
  const std::pair<std::string*, const char*> files[] = {
      {&resolved.train_images, "train-images-idx3-ubyte"},
      {&resolved.train_labels, "train-labels-idx1-ubyte"},
      {&resolved.test_images, "t10k-images-idx3-ubyte"},
      {&resolved.test_labels, "t10k-labels-idx1-ubyte"},
  };
  for (const auto& [path, name] : files) {
    if (!path->empty()) continue;
    const std::string plain = (std::filesystem::path(config.dir) / name).string();
    std::error_code ignored;
    if (std::filesystem::is_regular_file(plain, ignored)) {
      *path = plain;
    } else if (std::filesystem::is_regular_file(plain + ".gz", ignored)) {
      *path = plain + ".gz";
    } else {
      throw ConfigError(fmt::format("data: neither {} nor {}.gz exists", plain, plain));
    }
  }
  return resolved;
}

std::pair<Dataset, Dataset> load_data(const DataConfig& config,
                                      const std::vector<int>& input_shape) {
  check_input_shape(input_shape);
  if (config.source == "synthetic") return make_synthetic_splits(config, input_shape);
  DT_ENFORCE(config.source == "idx", "unknown data source \"{}\"", config.source);
  const DataConfig paths = resolve_idx_paths(config);
  Dataset train = load_idx_pair(paths.train_images, paths.train_labels);
  check_matches_model(train, input_shape, paths.train_images);
  Dataset test = load_idx_pair(paths.test_images, paths.test_labels, Split::kTest);
  check_matches_model(test, input_shape, paths.test_images);
  train.classes = test.classes = std::max(train.classes, test.classes);
  return {std::move(train), std::move(test)};
}

namespace {

// in (NHWC, one example) to out (CHW); in is bytes or floats, see Dataset::pixel.
template <typename T>
void to_chw(const T* in, int64_t plane, int channels, float* out) {
  auto value = [](T v) -> float {
    if constexpr (std::is_same_v<T, uint8_t>) {
      return static_cast<float>(v) / 255.0f;
    } else {
      return v;
    }
  };
  if (channels == 1) {
    for (int64_t pixel = 0; pixel < plane; ++pixel) out[pixel] = value(in[pixel]);
    return;
  }
  for (int64_t pixel = 0; pixel < plane; ++pixel) {
    for (int c = 0; c < channels; ++c) out[c * plane + pixel] = value(in[pixel * channels + c]);
  }
}

}  // namespace

void copy_example_chw(const Dataset& data, int64_t example, float* out) {
  const int64_t plane = int64_t{data.height} * data.width;
  const int64_t first = example * plane * data.channels;
  if (!data.bytes.empty()) return to_chw(data.bytes.data() + first, plane, data.channels, out);
  to_chw(data.images.data() + first, plane, data.channels, out);
}

void copy_nchw(const Dataset& data, int64_t first, int n, float* out) {
  const size_t per_example = static_cast<size_t>(data.height) * data.width * data.channels;
  for (int i = 0; i < n; ++i)
    copy_example_chw(data, first + i, out + static_cast<size_t>(i) * per_example);
}

}  // namespace dtrain::data
