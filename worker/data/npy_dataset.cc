// See npy_dataset.h. Elements are read with memcpy: a stored .npz member's data need not be
// aligned. The only copy of the pixels is the one into the Dataset.
#include "worker/data/npy_dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/errors.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", where, what));
}

std::string shape_of(const NpyArray& array) {
  return fmt::format("({}{})", fmt::join(array.shape, ", "), array.shape.size() == 1 ? "," : "");
}

int dimension(const NpyArray& array, size_t i, const std::string& where) {
  if (array.shape[i] > std::numeric_limits<int>::max())
    fail(where, fmt::format("dimension {} of shape {} is too large", i, shape_of(array)));
  return static_cast<int>(array.shape[i]);
}

// Labels of type T to int32, each checked; returns the largest.
template <typename T>
int32_t convert_labels(const NpyArray& labels, const std::string& where,
                       std::vector<int32_t>& out) {
  constexpr int64_t kLargest = std::numeric_limits<int32_t>::max() - 1;  // classes fits int32
  out.resize(static_cast<size_t>(labels.count));
  int32_t largest = 0;
  for (int64_t i = 0; i < labels.count; ++i) {
    T value;
    std::memcpy(&value, labels.data.get() + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    bool negative = false, too_large = false;
    if constexpr (std::is_signed_v<T>) negative = value < 0;
    if (!negative) too_large = static_cast<uint64_t>(value) > static_cast<uint64_t>(kLargest);
    if (negative || too_large) {
      fail(where, fmt::format("label {} at index {} is {}", +value, i,
                              negative ? "negative" : "too large for int32 classes"));
    }
    out[static_cast<size_t>(i)] = static_cast<int32_t>(value);
    largest = std::max(largest, out[static_cast<size_t>(i)]);
  }
  return largest;
}

// Float labels (Keras takes y of any dtype and casts it): each a whole, non-negative class index
// below 2^31 - 1, else exit 2 naming the first that is not.
template <typename T>
int32_t convert_float_labels(const NpyArray& labels, const std::string& where,
                             std::vector<int32_t>& out) {
  constexpr double kLargest = std::numeric_limits<int32_t>::max() - 1;
  out.resize(static_cast<size_t>(labels.count));
  int32_t largest = 0;
  for (int64_t i = 0; i < labels.count; ++i) {
    T value;
    std::memcpy(&value, labels.data.get() + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    const double v = static_cast<double>(value);
    if (!(v >= 0 && v <= kLargest && v == std::floor(v))) {
      fail(where, fmt::format("label {} at index {} is not a class index (a whole number from 0): "
                              "float labels must hold class indices",
                              v, i));
    }
    out[static_cast<size_t>(i)] = static_cast<int32_t>(v);
    largest = std::max(largest, out[static_cast<size_t>(i)]);
  }
  return largest;
}

int32_t to_int32_labels(const NpyArray& labels, const std::string& where,
                        std::vector<int32_t>& out) {
  switch (labels.dtype) {
    case NpyDtype::kUint8:
      return convert_labels<uint8_t>(labels, where, out);
    case NpyDtype::kInt8:
      return convert_labels<int8_t>(labels, where, out);
    case NpyDtype::kUint16:
      return convert_labels<uint16_t>(labels, where, out);
    case NpyDtype::kInt16:
      return convert_labels<int16_t>(labels, where, out);
    case NpyDtype::kUint32:
      return convert_labels<uint32_t>(labels, where, out);
    case NpyDtype::kInt32:
      return convert_labels<int32_t>(labels, where, out);
    case NpyDtype::kUint64:
      return convert_labels<uint64_t>(labels, where, out);
    case NpyDtype::kInt64:
      return convert_labels<int64_t>(labels, where, out);
    case NpyDtype::kFloat32:
      return convert_float_labels<float>(labels, where, out);
    case NpyDtype::kFloat64:
      return convert_float_labels<double>(labels, where, out);
  }
  fail(where, fmt::format("dtype '{}' is not supported ({})", labels.descr, kNpyLabelDtypes));
}

}  // namespace

Dataset images_from_npy(const NpyArray& images, const std::string& images_where) {
  if (npy_is_integer(images.dtype) && images.dtype != NpyDtype::kUint8)
    fail(images_where,
         fmt::format("dtype '{}' is not supported ({})", images.descr, kNpyImageDtypes));
  if (images.shape.size() < 2 || images.shape.size() > 4) {
    fail(images_where, fmt::format("inputs must have shape (N, H, W), (N, H, W, C) or, for a "
                                   "model of input_shape [F], (N, F); not {}",
                                   shape_of(images)));
  }
  if (images.count == 0)
    fail(images_where, fmt::format("no examples (shape {})", shape_of(images)));
  Dataset data;
  data.count = images.shape[0];
  if (images.shape.size() == 2) {  // tabular: F features, a 1x1 image of F channels
    data.height = data.width = 1;
    data.channels = dimension(images, 1, images_where);
  } else {
    data.height = dimension(images, 1, images_where);
    data.width = dimension(images, 2, images_where);
    data.channels = images.shape.size() == 4 ? dimension(images, 3, images_where) : 1;
  }
  const uint8_t* pixels = images.data.get();
  if (images.dtype == NpyDtype::kUint8) {
    data.shared_bytes = images.data;  // the file's bytes (or inflated buffer) themselves: no copy
  } else if (images.dtype == NpyDtype::kFloat32) {
    data.images.resize(static_cast<size_t>(images.count));
    std::memcpy(data.images.data(), pixels, images.bytes);
  } else {  // float64 (x / 255.0 makes it): cast to float32, as Keras casts to floatx
    data.images.resize(static_cast<size_t>(images.count));
    for (int64_t i = 0; i < images.count; ++i) {
      double value;
      std::memcpy(&value, pixels + i * static_cast<int64_t>(sizeof value), sizeof value);
      data.images[static_cast<size_t>(i)] = static_cast<float>(value);
    }
  }
  return data;
}

Dataset dataset_from_npy(const NpyArray& images, const std::string& images_where,
                         const NpyArray& labels, const std::string& labels_where, Split split) {
  Dataset data = images_from_npy(images, images_where);
  if (labels.shape.size() != 1 && !(labels.shape.size() == 2 && labels.shape[1] == 1)) {
    fail(labels_where,
         fmt::format("labels must have shape (N,) or (N, 1), not {}{}", shape_of(labels),
                     labels.shape.size() == 2 ? " (rows of one value per class are one-hot "
                                                "labels: they go with categorical_crossentropy)"
                                              : ""));
  }
  if (images.shape[0] != labels.shape[0]) {
    throw ConfigError(fmt::format("{} has {} images but {} has {} labels", images_where,
                                  images.shape[0], labels_where, labels.shape[0]));
  }
  const int32_t largest = to_int32_labels(labels, labels_where, data.labels);
  const auto [low, high] = std::minmax_element(data.labels.begin(), data.labels.end());
  if (split == Split::kTrain && *low == *high) {
    fail(labels_where,
         fmt::format("all labels are {}; a classifier needs at least 2 classes", *low));
  }
  data.classes = largest + 1;
  data.labels_source = labels_where;
  return data;
}

namespace {

// Element i of a numeric array, as a double.
double element(const NpyArray& a, int64_t i) {
  const uint8_t* at = a.data.get() + i * static_cast<int64_t>(npy_itemsize(a.dtype));
  auto read = [at](auto value) {
    std::memcpy(&value, at, sizeof value);
    return static_cast<double>(value);
  };
  switch (a.dtype) {
    case NpyDtype::kUint8:
      return read(uint8_t{});
    case NpyDtype::kInt8:
      return read(int8_t{});
    case NpyDtype::kUint16:
      return read(uint16_t{});
    case NpyDtype::kInt16:
      return read(int16_t{});
    case NpyDtype::kUint32:
      return read(uint32_t{});
    case NpyDtype::kInt32:
      return read(int32_t{});
    case NpyDtype::kUint64:
      return read(uint64_t{});
    case NpyDtype::kInt64:
      return read(int64_t{});
    case NpyDtype::kFloat32:
      return read(float{});
    case NpyDtype::kFloat64:
      return read(double{});
  }
  return 0;
}

}  // namespace

Dataset dataset_with_targets(const NpyArray& images, const std::string& images_where,
                             const NpyArray& labels, const std::string& labels_where,
                             const std::string& kind) {
  Dataset data = images_from_npy(images, images_where);
  if (labels.shape.empty() || labels.shape.size() > 2)
    fail(labels_where,
         fmt::format("labels must have shape (N,) or (N, K), not {}", shape_of(labels)));
  if (images.shape[0] != labels.shape[0]) {
    throw ConfigError(fmt::format("{} has {} examples but {} has {} labels", images_where,
                                  images.shape[0], labels_where, labels.shape[0]));
  }
  const int width = labels.shape.size() == 2 ? dimension(labels, 1, labels_where) : 1;
  if (width < 1)
    fail(labels_where, fmt::format("no values per example (shape {})", shape_of(labels)));
  if (kind == "one_hot" && width == 1) {
    fail(labels_where,
         fmt::format("categorical_crossentropy takes one-hot labels of shape (N, classes), and "
                     "these are {}: class indices go with sparse_categorical_crossentropy",
                     shape_of(labels)));
  }
  const bool probabilities = kind == "one_hot" || kind == "binary";
  data.labels.resize(static_cast<size_t>(labels.count));
  for (int64_t i = 0; i < labels.count; ++i) {
    const double v = element(labels, i);
    if (!std::isfinite(v) || (probabilities && (v < 0 || v > 1))) {
      fail(labels_where,
           fmt::format("label {} of example {} is {}", i % width, i / width,
                       std::isfinite(v)
                           ? fmt::format("{}: a cross-entropy's targets are in [0, 1]", v)
                           : fmt::format("{} (not a number)", v)));
    }
    data.labels[static_cast<size_t>(i)] = target_word(static_cast<float>(v));
  }
  data.target_width = width;
  data.classes = width;
  data.labels_source = labels_where;
  return data;
}

}  // namespace dtrain::data
