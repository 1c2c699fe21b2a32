// The `train.data` object (docs/train-config.md): which source, its files and keys, Keras's
// validation_split and tf.data's shard policy. Parsing only, no file opened: worker/data/dataset.h
// loads what it names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/json.h"

namespace dtrain::data {

/// The `train.data` object. Paths left empty are found in dir when the data is loaded.
struct DataConfig {
  std::string source = "idx";  ///< "idx" | "npz" | "npy" | "directory" | "synthetic" | "text" |
                               ///< "tokens"
  std::string dir = "/usr/share/datasets/fashion-mnist";
  /// idx: optional (else found in dir); npy: the four .npy files (test ones when needed).
  std::string train_images, train_labels, test_images, test_labels;
  std::string path;  ///< npz: the archive
  /// npz: the arrays' keys (Keras's names by default).
  std::string x_train = "x_train", y_train = "y_train", x_test = "x_test", y_test = "y_test";
  int64_t examples = 1024;  ///< synthetic: training examples (test split: a quarter, >= classes)
  int classes = 10;         ///< synthetic only
  /// directory, as Keras's image_dataset_from_directory: a folder per class in train_dir (and
  /// test_dir, optional); class_names (else the folders' names, sorted); color_mode "grayscale",
  /// "rgb" or "rgba"; image_size [height, width] resizes (bilinear), 0 keeps each image's size.
  std::string train_dir, test_dir;
  std::vector<std::string> class_names;
  std::string color_mode = "rgb";
  int image_height = 0, image_width = 0;
  /// Any file source, Keras's validation_split: validate on this fraction of the training data
  /// instead of a test split (arrays: their last examples, as Keras's fit; directory: the last
  /// files after a shuffle with split_seed, as image_dataset_from_directory). 0: none.
  double validation_split = 0;
  uint64_t split_seed = 0;
  /// text and tokens (text_data.h): the windows' length (0: the model's input_shape [T]); text:
  /// vocabulary "characters" or "bytes"; tokens: vocabulary_size (every id below it) and
  /// validation_path (else validation_split, 0.1 by default for both, validates on the last
  /// tokens).
  int sequence_length = 0;
  std::string vocabulary = "characters";
  int vocabulary_size = 0;
  std::string validation_path;
  /// tf.data's AutoShardPolicy: "data" (every worker holds all the training data and takes its
  /// share of each epoch's order) or "file" (directory only: each worker decodes only its files,
  /// i, i + workers, ..., and shuffles them alone).
  std::string shard_policy = "data";
  /// Set from train.loss, not a key: "" (class indices), "one_hot" (categorical_crossentropy:
  /// rows of one value per class; class-index sources are turned into one-hot rows, as Keras's
  /// label_mode "categorical") or "values" (binary_crossentropy, regression: each example's
  /// values as floats; a class-index source gives its index). Arrays are read as they are.
  std::string targets;
};

/// Reads node (e.g. "train.data"); ConfigError naming the JSON path for unknown keys, bad
/// values, and keys that do not belong to the chosen source.
DataConfig parse_data_config(const common::JsonNode& node);

}  // namespace dtrain::data
