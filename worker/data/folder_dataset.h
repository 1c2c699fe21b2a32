// The "directory" data source (Keras's image_dataset_from_directory over image_folder.h) and
// what `train.data` adds to every file source: Keras's validation_split and tf.data's FILE
// sharding. It reads the config's keys and builds Datasets; the model's shape is dataset.cc's to
// check, and order and batching are batcher.h's. Sharding arrays by "file" keeps each worker's
// rows after the arrays are read whole: it fixes each worker's share, it saves no reading.
#pragma once

#include <utility>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/data/image_folder.h"

namespace dtrain::data {

/// The directory source's train and validation splits: the files of config.train_dir (without
/// the last validation_split of them, after a shuffle with split_seed, when it is set), and those
/// last files or config.test_dir's (only when need_test; else count 0). With shard_policy
/// "file" the train split holds only shard.index's share of the files (global_count says how
/// many there are in all). Images are decoded on up to 8 threads; ConfigError names the file or
/// folder (image_folder.h). Before any image is decoded, the size they will have (image_size, or
/// the first file's header) and color_mode's channels are checked against input_shape ([height,
/// width, channels]), and their total against the machine's memory (or its cgroup's limit).
std::pair<Dataset, Dataset> load_folder_splits(const DataConfig& config,
                                               const std::vector<int>& input_shape, bool need_test,
                                               FileShard shard);

/// The files of folder, decoded as the directory source decodes them (config's color_mode and
/// image_size, on up to 8 threads, checked against input_shape before any is decoded), labelled
/// with their files' labels and class_names; for `dtrain evaluate` and `dtrain predict`, which
/// read a folder or file the run was not trained on.
Dataset load_image_list(const DataConfig& config, const ImageFolder& folder,
                        const std::vector<std::string>& class_names,
                        const std::vector<int>& input_shape);

/// train's examples shard.index, shard.index + shard.count, ... (shard_policy "file" on arrays:
/// each worker keeps a fixed share, as it would keep its files), global_count set. ConfigError
/// when there are fewer examples than workers.
Dataset keep_shard(Dataset train, FileShard shard);

/// train's last floor(fraction * count) examples as a validation split, the rest as the train
/// split (Keras's fit(validation_split=...): the arrays' last examples, before any shuffle).
/// ConfigError when either part would be empty.
std::pair<Dataset, Dataset> split_last(Dataset train, double fraction);

}  // namespace dtrain::data
