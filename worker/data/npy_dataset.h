// Turns NumPy arrays (npy_file.h, npz_file.h) into a Dataset: images (N, H, W) or (N, H, W, C) of
// uint8 (kept as bytes) or float32 (kept as they are), labels (N) or (N, 1) of any integer dtype
// (to int32). Checks that they belong together; the model's shape is dataset.cc's to check.
#pragma once

#include <string>

#include "worker/data/dataset.h"
#include "worker/data/npy_file.h"

namespace dtrain::data {

/// What images and labels may be, for the reader's dtype messages.
inline constexpr const char* kNpyImageDtypes =
    "images: uint8, float32, or float64 (cast to float32)";
inline constexpr const char* kNpyLabelDtypes =
    "labels: an integer type, or float32/float64 holding whole class indices";

/// The inputs alone (no labels, classes 0): (N, H, W) or (N, H, W, C) images, or (N, F) rows of
/// F features (height and width 1, F channels: a model of input_shape [F]). ConfigError naming
/// images_where for a wrong rank or dtype, or no examples.
Dataset images_from_npy(const NpyArray& images, const std::string& images_where);

/// The Dataset of images and labels. images_where and labels_where name them in errors
/// ("data.npz: x_train"). ConfigError for a wrong rank or dtype, no examples, counts that differ
/// (naming both), a label below 0 or too large for int32 (naming its index), and, for a training
/// split, labels that are all one class. classes = largest label + 1. Float
/// images and labels are copied; uint8 images are shared with the reader (Dataset::shared_bytes).
Dataset dataset_from_npy(const NpyArray& images, const std::string& images_where,
                         const NpyArray& labels, const std::string& labels_where, Split split);

/// The Dataset of inputs and float targets (DataConfig::targets, kind "one_hot", "binary" or
/// "values"): labels of any numeric dtype, (N,) (one value each) or (N, K) (K each), kept as
/// floats' bits (target_word), target_width and classes K. ConfigError naming labels_where:
/// "one_hot" labels of shape (N,) (class indices: sparse_categorical_crossentropy's), a value
/// that is not finite, a cross-entropy's target outside [0, 1], counts that differ.
Dataset dataset_with_targets(const NpyArray& images, const std::string& images_where,
                             const NpyArray& labels, const std::string& labels_where,
                             const std::string& kind);

}  // namespace dtrain::data
