// Datasets held in memory: a pair of IDX files, an .npz archive or .npy files, a folder of PNG
// and JPEG images per class (uint8 images kept as their bytes, turned into floats in [0, 1] only
// when an example is copied out), or synthetic, learnable data for tests (floats); and the
// `train.data` config that picks between them, with Keras's validation_split and tf.data's FILE
// sharding. Order and batching are batcher.h's; the model's shape is checked here, nothing else.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/spec/data_config.h"

namespace dtrain::data {

/// Examples in NHWC order, pixels scaled to [0, 1]; labels in [0, classes). The pixels are either
/// bytes (IDX files, image folders, uint8 arrays: value / 255 when copied out, a quarter of the
/// memory and no conversion at start) or floats (float32 arrays, synthetic data). Bytes are in
/// `bytes`, or shared where a NumPy reader keeps them (shared_bytes).
struct Dataset {
  int64_t count = 0;
  int height = 0, width = 0, channels = 0;
  int classes = 0;
  std::vector<uint8_t> bytes;  ///< count * height * width * channels, or empty
  std::vector<float> images;   ///< count * height * width * channels, or empty
  std::vector<int32_t> labels;
  /// uint8 images where an .npy or .npz reader keeps them (the file's bytes, read whole into
  /// memory and never mapped, or a member's inflated buffer), shared, not copied. Null when bytes
  /// or images hold the pixels.
  std::shared_ptr<const uint8_t> shared_bytes;
  /// Where the labels came from, for messages ("data.npz: y_train", a file, a folder).
  std::string labels_source;
  /// The directory source's class names (label i is class_names[i]); empty for other sources.
  std::vector<std::string> class_names;
  /// Sharded by file (DataConfig::shard_policy "file"): the training examples of all workers,
  /// of which this Dataset holds its worker's share. 0: not sharded (count is all of them).
  int64_t global_count = 0;
  /// A text split (sources "text" and "tokens", text_data.h): its token_count token ids, in
  /// memory or mapped from the file, kept alive by the pointer. height is the sequence length T
  /// (width and channels 1), classes the vocabulary's size, count the split's non-overlapping
  /// windows ((token_count - 1) / T): example i is x = tokens[iT, iT + T), its labels the T
  /// tokens one further. Null for images.
  std::shared_ptr<const uint16_t> tokens = nullptr;
  int64_t token_count = 0;
  /// "characters" (symbols: each id's UTF-8 text), "bytes" or "tokens" (symbols empty).
  std::string vocabulary = {};
  std::vector<std::string> symbols = {};
  /// Float targets (a loss other than sparse categorical cross-entropy, DataConfig::targets):
  /// target_width floats per example, whose bits labels holds (target_word), so one int32 pipeline
  /// carries class indices and targets alike. 0: labels are class indices.
  int target_width = 0;

  bool is_text() const { return tokens != nullptr; }
  /// Labels per example: a text window's T positions, else 1.
  int positions() const { return is_text() ? height : 1; }
  /// Label words per example: a text window's T, a target row's target_width, else 1.
  int label_width() const { return is_text() ? height : target_width > 0 ? target_width : 1; }

  bool has_bytes() const { return shared_bytes != nullptr || !bytes.empty(); }
  /// The bytes, wherever they are (null for float images).
  const uint8_t* byte_data() const { return shared_bytes ? shared_bytes.get() : bytes.data(); }
  /// count * height * width * channels, wherever they are.
  size_t pixel_count() const {
    return has_bytes() ? static_cast<size_t>(count) * height * width * channels : images.size();
  }
  /// Pixel i (NHWC order) in [0, 1].
  float pixel(size_t i) const {
    return has_bytes() ? static_cast<float>(byte_data()[i]) / 255.0f : images[i];
  }
  /// Copies shared bytes into `bytes` (before its rows are rearranged); nothing otherwise.
  void own_bytes() {
    if (!shared_bytes) return;
    bytes.assign(shared_bytes.get(), shared_bytes.get() + pixel_count());
    shared_bytes.reset();
  }
};

/// A float target as a label word (its bits), and back.
inline int32_t target_word(float value) {
  int32_t word;
  std::memcpy(&word, &value, sizeof word);
  return word;
}
inline float target_value(int32_t word) {
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

/// Whether a split's labels must name at least 2 classes: a classifier cannot learn from one, but
/// it can be measured on one (a test split of a single class is a valid, if narrow, test).
enum class Split { kTrain, kTest };

/// Loads an images file (N x H x W, one channel) and its labels file. ConfigError when either
/// file is bad (idx_file.h), when the counts differ (naming both files), or, for a training
/// split, when all labels are 0. classes = largest label + 1. Blocks on file I/O.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                      Split split = Split::kTrain);

/// Learnable synthetic data: each class has a fixed random prototype image (from seed) and
/// example i is its class's prototype plus small noise, clamped to [0, 1]; label i % classes.
/// Example i depends only on (seed, i + first_index, shape), so two calls with the same seed
/// and disjoint index ranges are a train and a test split of one distribution.
Dataset make_synthetic(int64_t examples, int classes, int height, int width, int channels,
                       uint64_t seed, int64_t first_index = 0);

/// The share of the training files this worker loads under shard_policy "file".
struct FileShard {
  int index = 0;
  int count = 1;
};

/// config with its empty idx paths filled from dir: "<dir>/train-images-idx3-ubyte" if that
/// file exists, else the same name + ".gz"; ConfigError when neither exists.
DataConfig resolve_idx_paths(const DataConfig& config);

/// Seed of the synthetic source: fixed, so every worker and every restart sees the same data.
inline constexpr uint64_t kSyntheticSeed = 0x5eedda7a;

/// The train and test splits. input_shape is the model's [height, width, channels]: file data
/// must match it (ConfigError "data: images are 28x28x1 but model.input_shape is [32, 32, 3]");
/// synthetic data is made in that shape. Both splits get the same `classes`; only the train
/// split must have 2 or more. need_test false (no validation, not an evaluator): npz and npy
/// leave the test split empty (count 0) and need no test arrays; idx and synthetic load it
/// anyway.
/// validation_split: the validation examples come from the training data and no test split is
/// read. shard (shard_policy "file" only): this worker's share of the training files.
std::pair<Dataset, Dataset> load_data(const DataConfig& config, const std::vector<int>& input_shape,
                                      bool need_test = true, FileShard shard = {});

/// A class-index split (not text) as float targets of kind ("one_hot": rows of `width`, a 1 at
/// the label; "values": the label itself, width 1). Nothing for a split that holds targets.
void to_targets(Dataset& data, const std::string& kind, int width);

/// ConfigError naming data.labels_source, the first label at or above classes (the model's
/// output units) and its example index.
void check_labels_below(const Dataset& data, int classes);

/// Copies example `example` (stored channels-last) to out in CHW order: a plain copy for one
/// channel. out holds height * width * channels floats.
void copy_example_chw(const Dataset& data, int64_t example, float* out);

/// Examples [first, first + n) as an NCHW batch (a text split: each window's token ids).
void copy_nchw(const Dataset& data, int64_t first, int n, float* out);

/// The labels of examples [first, first + n): data.label_width() per example.
void copy_labels(const Dataset& data, int64_t first, int n, int32_t* out);

/// A text split's window at token `offset`: its T ids (as floats) to x, the T ids one further to
/// labels.
void copy_window(const Dataset& data, int64_t offset, float* x, int32_t* labels);

}  // namespace dtrain::data
