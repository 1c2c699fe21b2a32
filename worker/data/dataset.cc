// See dataset.h (npy_dataset.h turns NumPy arrays into a Dataset). Loading converts bytes to
// floats once. The config is read without touching files (worker/spec/data_config.h);
// resolve_idx_paths and the readers look at them when the data is loaded.
#include "worker/data/dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <type_traits>

#include "common/errors.h"
#include "worker/data/batcher.h"
#include "worker/data/folder_dataset.h"
#include "worker/data/idx_file.h"
#include "worker/data/npy_dataset.h"
#include "worker/data/npz_file.h"
#include "worker/data/text_data.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

constexpr float kSyntheticNoise = 0.1f;                    ///< noise is uniform in +-this
constexpr int64_t kMaxSyntheticFloats = int64_t{1} << 28;  ///< 1 GiB of images per split

std::string shape_text(int height, int width, int channels) {
  if (height == 1 && width == 1) return fmt::format("{} features", channels);  // tabular
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
  const bool tabular = input_shape[0] == 1 && input_shape[1] == 1;
  throw ConfigError(fmt::format(
      "data: {} are {} but model.input_shape is [{}] ({})", tabular ? "inputs" : "images",
      shape_text(data.height, data.width, data.channels),
      tabular ? std::to_string(input_shape[2]) : fmt::format("{}", fmt::join(input_shape, ", ")),
      images_path));
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

// One split of an npz or npy source, checked against the model.
Dataset load_npy_split(const DataConfig& config, const std::vector<int>& input_shape, Split split) {
  const bool train = split == Split::kTrain;
  std::string images_where, labels_where;
  NpyArray images, labels;
  if (config.source == "npz") {
    NpzFile archive(config.path);
    const std::string& x = train ? config.x_train : config.x_test;
    const std::string& y = train ? config.y_train : config.y_test;
    images = archive.read(x, kNpyImageDtypes);
    labels = archive.read(y, config.targets.empty() ? kNpyLabelDtypes : kNpyAnyDtype);
    images_where = fmt::format("{}: {}", config.path, x);
    labels_where = fmt::format("{}: {}", config.path, y);
  } else {
    images_where = train ? config.train_images : config.test_images;
    labels_where = train ? config.train_labels : config.test_labels;
    if (images_where.empty() || labels_where.empty()) {
      throw ConfigError(
          "data: \"source\": \"npy\" needs \"test_images\" and \"test_labels\" when the job "
          "validates (\"validation\": true) or has an evaluator");
    }
    images = read_npy(images_where, kNpyImageDtypes);
    labels = read_npy(labels_where, config.targets.empty() ? kNpyLabelDtypes : kNpyAnyDtype);
  }
  Dataset data =
      config.targets.empty()
          ? dataset_from_npy(images, images_where, labels, labels_where, split)
          : dataset_with_targets(images, images_where, labels, labels_where, config.targets);
  check_matches_model(data, input_shape, images_where);
  return data;
}

std::pair<Dataset, Dataset> load_npy_splits(const DataConfig& config,
                                            const std::vector<int>& input_shape, bool need_test) {
  Dataset train = load_npy_split(config, input_shape, Split::kTrain);
  Dataset test;
  if (need_test) test = load_npy_split(config, input_shape, Split::kTest);
  if (need_test && test.target_width != train.target_width) {
    throw ConfigError(fmt::format("{} has {} values per example but {} has {}", train.labels_source,
                                  train.target_width, test.labels_source, test.target_width));
  }
  train.classes = test.classes = std::max(train.classes, test.classes);
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
  data.labels_source = labels_path;
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

  Dataset data;
  data.count = examples;
  data.height = height, data.width = width, data.channels = channels;
  data.classes = classes;
  data.labels_source = "synthetic data";
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

std::pair<Dataset, Dataset> load_data(const DataConfig& config, const std::vector<int>& input_shape,
                                      bool need_test, FileShard shard) {
  const bool text = config.source == "text" || config.source == "tokens";
  if (text || input_shape.size() == 1) {
    if (!text || input_shape.size() != 1) {
      throw ConfigError(fmt::format(
          text ? "data: \"source\": \"{}\" gives token ids: model.input_shape must be "
                 "[sequence_length], not [{}]"
               : "data: model.input_shape [{1}] is a sequence of token ids: the data source must "
                 "be \"text\" or \"tokens\", not \"{0}\"",
          config.source, fmt::join(input_shape, ", ")));
    }
    if (config.sequence_length != 0 && config.sequence_length != input_shape[0]) {
      throw ConfigError(
          fmt::format("data.sequence_length is {} but model.input_shape is [{}]: give one, or "
                      "the same",
                      config.sequence_length, input_shape[0]));
    }
    return load_text_splits(config, input_shape[0], need_test);
  }
  check_input_shape(input_shape);
  std::pair<Dataset, Dataset> splits;
  if (config.source == "synthetic") {
    splits = make_synthetic_splits(config, input_shape);
  } else if (config.source == "directory") {
    splits = load_folder_splits(config, input_shape, need_test, shard);
    check_matches_model(splits.first, input_shape, config.train_dir);
    if (splits.second.count > 0)
      check_matches_model(splits.second, input_shape,
                          config.test_dir.empty() ? config.train_dir : config.test_dir);
  } else if (config.validation_split > 0) {  // the last examples validate; no test split is read
    DataConfig whole = config;
    whole.validation_split = 0;
    whole.shard_policy = "data";
    splits = split_last(load_data(whole, input_shape, false).first, config.validation_split);
  } else if (config.source == "npz" || config.source == "npy") {
    splits = load_npy_splits(config, input_shape, need_test);
  } else {
    DT_ENFORCE(config.source == "idx", "unknown data source \"{}\"", config.source);
    const DataConfig paths = resolve_idx_paths(config);
    Dataset train = load_idx_pair(paths.train_images, paths.train_labels);
    check_matches_model(train, input_shape, paths.train_images);
    Dataset test = load_idx_pair(paths.test_images, paths.test_labels, Split::kTest);
    check_matches_model(test, input_shape, paths.test_images);
    train.classes = test.classes = std::max(train.classes, test.classes);
    splits = {std::move(train), std::move(test)};
  }
  if (config.shard_policy == "file" && config.source != "directory" && config.source != "synthetic")
    splits.first = keep_shard(std::move(splits.first), shard);
  if (!config.targets.empty()) {
    const int width = std::max(splits.first.classes, splits.second.classes);
    to_targets(splits.first, config.targets, width);
    to_targets(splits.second, config.targets, width);
  }
  return splits;
}

void to_targets(Dataset& data, const std::string& kind, int width) {
  if (data.target_width > 0 || data.is_text() || data.count == 0) return;
  std::vector<int32_t> words;
  if (kind == "one_hot") {
    words.assign(static_cast<size_t>(data.count) * static_cast<size_t>(width), target_word(0));
    for (int64_t i = 0; i < data.count; ++i)
      words[static_cast<size_t>(i) * width +
            static_cast<size_t>(data.labels[static_cast<size_t>(i)])] = target_word(1);
    data.target_width = width;
    data.classes = width;
  } else {
    DT_ENFORCE(kind == "values" || kind == "binary", "targets \"{}\"", kind);
    for (size_t i = 0; i < data.labels.size(); ++i) {
      if (kind == "binary" && data.labels[i] > 1) {
        throw ConfigError(fmt::format(
            "{}: label {} (example {}): binary_crossentropy takes 0/1 labels (two classes)",
            data.labels_source, data.labels[i], i));
      }
      words.push_back(target_word(static_cast<float>(data.labels[i])));
    }
    data.target_width = 1;
    data.classes = 1;
  }
  data.labels = std::move(words);
}

namespace {

// in (NHWC, one example) to out (CHW); in is bytes or floats, see Dataset::pixel. The loops are
// vectorised (the input pipeline's thread runs this for every example of every batch, beside
// the training step's threads); a vector division rounds exactly as a scalar one.
template <typename T>
void to_chw(const T* __restrict in, int64_t plane, int channels, float* __restrict out) {
  auto value = [](T v) -> float {
    if constexpr (std::is_same_v<T, uint8_t>) {
      return static_cast<float>(v) / 255.0f;
    } else {
      return v;
    }
  };
  if (channels == 1) {
#pragma omp simd
    for (int64_t pixel = 0; pixel < plane; ++pixel) out[pixel] = value(in[pixel]);
    return;
  }
  for (int c = 0; c < channels; ++c) {
#pragma omp simd
    for (int64_t pixel = 0; pixel < plane; ++pixel)
      out[c * plane + pixel] = value(in[pixel * channels + c]);
  }
}

}  // namespace

void check_labels_below(const Dataset& data, int classes) {
  if (data.is_text()) {
    if (data.classes > classes) {
      throw ConfigError(fmt::format(
          "{}: its vocabulary has {} tokens ({}) but the model's output has {} (its last layer's "
          "units)",
          data.labels_source, data.classes, data.vocabulary, classes));
    }
    return;
  }
  if (data.target_width > 0) {
    if (data.target_width != classes && data.count > 0) {
      throw ConfigError(fmt::format(
          "{}: {} value{} per example but the model's output has {} (its last layer's units)",
          data.labels_source, data.target_width, data.target_width == 1 ? "" : "s", classes));
    }
    return;
  }
  for (size_t i = 0; i < data.labels.size(); ++i) {
    if (data.labels[i] >= classes) {
      throw ConfigError(fmt::format(
          "{}: label {} (example {}) is outside the model's {} classes (its last layer's units)",
          data.labels_source, data.labels[i], i, classes));
    }
  }
}

void copy_example_chw(const Dataset& data, int64_t example, float* out) {
  const int64_t plane = int64_t{data.height} * data.width;
  const int64_t first = example * plane * data.channels;
  if (data.has_bytes()) return to_chw(data.byte_data() + first, plane, data.channels, out);
  to_chw(data.images.data() + first, plane, data.channels, out);
}

void copy_window(const Dataset& data, int64_t offset, float* x, int32_t* labels) {
  DT_ENFORCE(data.is_text() && offset >= 0 && offset + data.height < data.token_count,
             "window at {} of {} tokens", offset, data.token_count);
  const uint16_t* ids = data.tokens.get() + offset;
  for (int t = 0; t < data.height; ++t) x[t] = static_cast<float>(ids[t]);
  if (labels)
    for (int t = 0; t < data.height; ++t) labels[t] = ids[t + 1];
}

void copy_labels(const Dataset& data, int64_t first, int n, int32_t* out) {
  if (!data.is_text()) {
    const int64_t width = data.label_width();
    std::copy(data.labels.begin() + first * width, data.labels.begin() + (first + n) * width, out);
    return;
  }
  std::vector<float> x(static_cast<size_t>(data.height));
  for (int i = 0; i < n; ++i)
    copy_window(data, (first + i) * data.height, x.data(),
                out + static_cast<size_t>(i) * data.height);
}

void copy_nchw(const Dataset& data, int64_t first, int n, float* out) {
  if (data.is_text()) {
    for (int i = 0; i < n; ++i)
      copy_window(data, (first + i) * data.height, out + static_cast<size_t>(i) * data.height,
                  nullptr);
    return;
  }
  const size_t per_example = static_cast<size_t>(data.height) * data.width * data.channels;
  for (int i = 0; i < n; ++i)
    copy_example_chw(data, first + i, out + static_cast<size_t>(i) * per_example);
}

}  // namespace dtrain::data
