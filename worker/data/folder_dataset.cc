// See folder_dataset.h.
#include "worker/data/folder_dataset.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>
#include <thread>

#include "common/errors.h"
#include "worker/data/batcher.h"
#include "worker/data/image_folder.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

constexpr unsigned kMaxDecodeThreads = 8;
constexpr uint64_t kSplitStream = 0x5b117;  ///< derive_seed stream of the validation split

Dataset to_dataset(ImageArray images, const std::vector<std::string>& class_names,
                   const std::string& dir) {
  Dataset data;
  data.count = images.count;
  data.height = images.height, data.width = images.width, data.channels = images.channels;
  data.classes = static_cast<int>(class_names.size());
  data.bytes = std::move(images.pixels);
  data.labels = std::move(images.labels);
  data.class_names = class_names;
  data.labels_source = dir;
  return data;
}

// Memory the decoded images may take: the machine's, or its cgroup's limit when lower.
uint64_t memory_for_images() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0
                       ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                       : UINT64_MAX;
  uint64_t limit = 0;
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when there is none
  if (cgroup >> limit) bytes = std::min(bytes, limit);
  return bytes;
}

// Before any image is decoded: the size the images of files will have (image_size, or the first
// file's header) and color_mode's channels against the model's input_shape.
void check_shape_first(const ImageFolder& folder, const std::vector<size_t>& files,
                       const ImageLoadOptions& options, const std::vector<int>& input_shape) {
  if (files.empty() || input_shape.size() != 3) return;
  ImageSize size;
  std::string from;
  if (options.image_size) {
    size = *options.image_size;
    from = "image_size";
  } else {
    size = read_image_dimensions(folder.files[files[0]].path);
    from = fmt::format("{}, the first image; give image_size to resize them all",
                       folder.files[files[0]].path);
  }
  const int channels = channel_count(options.color_mode);
  if (size.height == input_shape[0] && size.width == input_shape[1] && channels == input_shape[2])
    return;
  throw ConfigError(fmt::format(
      "data: images in {} are {}x{}x{} but model.input_shape is [{}, {}, {}] ({}; color_mode "
      "gives the channels)",
      folder.dir, size.height, size.width, channels, input_shape[0], input_shape[1], input_shape[2],
      from));
}

unsigned decode_threads() {
  return std::clamp(std::thread::hardware_concurrency(), 1u, kMaxDecodeThreads);
}

// How the directory source decodes: config's color_mode and image_size, on up to 8 threads, within
// the machine's memory.
ImageLoadOptions load_options(const DataConfig& config) {
  ImageLoadOptions options;
  options.color_mode = parse_color_mode(config.color_mode);
  if (config.image_height > 0)
    options.image_size = ImageSize{config.image_height, config.image_width};
  options.threads = static_cast<int>(decode_threads());
  options.max_total_bytes = memory_for_images();
  return options;
}

// Indices [0, n) in ascending order, split into (train, validation): the validation part is the
// last floor(fraction * n) of a shuffle with seed, each part then sorted (folder order).
std::pair<std::vector<size_t>, std::vector<size_t>> split_files(size_t n, double fraction,
                                                                uint64_t seed,
                                                                const std::string& dir) {
  std::vector<size_t> train(n), validation;
  std::iota(train.begin(), train.end(), size_t{0});
  if (fraction <= 0) return {train, validation};
  const auto held = static_cast<size_t>(std::floor(fraction * static_cast<double>(n)));
  if (held == 0 || held >= n) {
    throw ConfigError(fmt::format(
        "data.validation_split {} of the {} images in {} leaves {} for validation and {} for "
        "training; both need at least one",
        fraction, n, dir, held, n - held));
  }
  std::vector<int64_t> order =
      epoch_order(static_cast<int64_t>(n), derive_seed(seed, kSplitStream), 0);
  train.assign(order.begin(), order.end() - static_cast<std::ptrdiff_t>(held));
  validation.assign(order.end() - static_cast<std::ptrdiff_t>(held), order.end());
  std::sort(train.begin(), train.end());
  std::sort(validation.begin(), validation.end());
  return {train, validation};
}

}  // namespace

std::pair<Dataset, Dataset> load_folder_splits(const DataConfig& config,
                                               const std::vector<int>& input_shape, bool need_test,
                                               FileShard shard) {
  ImageFolder folder = scan_image_folder(config.train_dir, config.class_names);
  if (folder.class_names.size() < 2) {
    throw ConfigError(fmt::format("{}: one class folder ({}); a classifier needs at least 2",
                                  config.train_dir, folder.class_names.front()));
  }
  auto [train_files, validation_files] = split_files(folder.files.size(), config.validation_split,
                                                     config.split_seed, config.train_dir);
  ImageLoadOptions options = load_options(config);

  int64_t global = 0;
  if (config.shard_policy == "file") {
    DT_ENFORCE(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count, "shard {} of {}",
               shard.index, shard.count);
    if (train_files.size() < static_cast<size_t>(shard.count)) {
      throw ConfigError(fmt::format("{}: {} training images for {} workers sharded by file",
                                    config.train_dir, train_files.size(), shard.count));
    }
    global = static_cast<int64_t>(train_files.size());
    std::vector<size_t> mine;
    for (size_t i = static_cast<size_t>(shard.index); i < train_files.size();
         i += static_cast<size_t>(shard.count))
      mine.push_back(train_files[i]);
    train_files = std::move(mine);
  }
  check_shape_first(folder, train_files, options, input_shape);
  Dataset train =
      to_dataset(load_images(folder, options, train_files), folder.class_names, config.train_dir);
  train.global_count = global;
  options.max_total_bytes -= std::min<uint64_t>(options.max_total_bytes, train.bytes.size());
  Dataset test;
  if (need_test) {
    if (!validation_files.empty()) {
      check_shape_first(folder, validation_files, options, input_shape);
      test = to_dataset(load_images(folder, options, validation_files), folder.class_names,
                        config.train_dir);
    } else if (!config.test_dir.empty()) {
      ImageFolder test_folder = scan_image_folder(config.test_dir, folder.class_names);
      std::vector<size_t> all(test_folder.files.size());
      std::iota(all.begin(), all.end(), size_t{0});
      check_shape_first(test_folder, all, options, input_shape);
      test =
          to_dataset(load_images(test_folder, options, all), folder.class_names, config.test_dir);
    } else {
      throw ConfigError(
          "data: validating a \"directory\" source needs \"test_dir\" or \"validation_split\"");
    }
    if (test.height != train.height || test.width != train.width) {
      throw ConfigError(fmt::format(
          "data: validation images are {}x{}, training images {}x{}: give \"image_size\"",
          test.height, test.width, train.height, train.width));
    }
  }
  return {std::move(train), std::move(test)};
}

Dataset load_image_list(const DataConfig& config, const ImageFolder& folder,
                        const std::vector<std::string>& class_names,
                        const std::vector<int>& input_shape) {
  ImageLoadOptions options = load_options(config);
  std::vector<size_t> all(folder.files.size());
  std::iota(all.begin(), all.end(), size_t{0});
  check_shape_first(folder, all, options, input_shape);
  return to_dataset(load_images(folder, options, all), class_names, folder.dir);
}

Dataset keep_shard(Dataset train, FileShard shard) {
  train.own_bytes();
  DT_ENFORCE(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count, "shard {} of {}",
             shard.index, shard.count);
  if (train.count < shard.count) {
    throw ConfigError(fmt::format("data: {} training examples for {} workers sharded by file",
                                  train.count, shard.count));
  }
  const size_t pixels = static_cast<size_t>(train.height) * train.width * train.channels;
  int64_t kept = 0;
  for (int64_t i = shard.index; i < train.count; i += shard.count, ++kept) {
    const auto from = static_cast<size_t>(i), to = static_cast<size_t>(kept);
    if (!train.bytes.empty())
      std::copy_n(train.bytes.begin() + from * pixels, pixels, train.bytes.begin() + to * pixels);
    if (!train.images.empty())
      std::copy_n(train.images.begin() + from * pixels, pixels, train.images.begin() + to * pixels);
    const size_t width = static_cast<size_t>(train.label_width());
    std::copy_n(train.labels.begin() + from * width, width, train.labels.begin() + to * width);
  }
  if (!train.bytes.empty()) train.bytes.resize(static_cast<size_t>(kept) * pixels);
  if (!train.images.empty()) train.images.resize(static_cast<size_t>(kept) * pixels);
  train.labels.resize(static_cast<size_t>(kept) * static_cast<size_t>(train.label_width()));
  train.global_count = train.count;
  train.count = kept;
  return train;
}

std::pair<Dataset, Dataset> split_last(Dataset train, double fraction) {
  train.own_bytes();
  const auto held = static_cast<int64_t>(std::floor(fraction * static_cast<double>(train.count)));
  if (held == 0 || held >= train.count) {
    throw ConfigError(fmt::format(
        "data.validation_split {} of {} training examples leaves {} for validation and {} for "
        "training; both need at least one",
        fraction, train.count, held, train.count - held));
  }
  const int64_t kept = train.count - held;
  const size_t pixels = static_cast<size_t>(train.height) * train.width * train.channels;
  Dataset validation;
  validation.count = held;
  validation.height = train.height, validation.width = train.width;
  validation.channels = train.channels, validation.classes = train.classes;
  validation.labels_source = train.labels_source;
  validation.target_width = train.target_width;
  auto tail = [&](auto& from, auto& to, size_t per) {
    to.assign(from.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(kept) * per),
              from.end());
    from.resize(static_cast<size_t>(kept) * per);
  };
  if (!train.bytes.empty()) tail(train.bytes, validation.bytes, pixels);
  if (!train.images.empty()) tail(train.images, validation.images, pixels);
  tail(train.labels, validation.labels, static_cast<size_t>(train.label_width()));
  train.count = kept;
  return {std::move(train), std::move(validation)};
}

}  // namespace dtrain::data
