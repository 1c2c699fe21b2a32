// A folder of images laid out as Keras's image_dataset_from_directory expects (one subfolder per
// class), scanned into (file, label) pairs, and a loader that decodes all or some of them into
// one uint8 NHWC buffer on a few threads. It does not shuffle, split, batch or scale to floats:
// the data sources (dataset.h) and the batcher do that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/data/image_decode.h"

namespace dtrain::data {

struct ImageFile {
  std::string path;
  int label = 0;  ///< index into ImageFolder::class_names
};

struct ImageFolder {
  std::string dir;
  std::vector<std::string> class_names;  ///< label i is class_names[i]
  std::vector<ImageFile> files;          ///< class by class, each in Keras's order
};

/// Scans dir: each subfolder is a class, named after it; class_names sorted (byte order, as
/// Python's sorted), or exactly class_names in that order when given (other subfolders are then
/// ignored, where Keras refuses them). In each class folder, as Keras: files ending in .png, .jpg
/// or .jpeg (any case) found by walking it, subfolders included, folder by folder in sorted path
/// order and sorted by name within each; other files are ignored. Unlike Keras, names starting with
/// '.' are skipped (files and folders: macOS's ._x.jpg, .ipynb_checkpoints), and an empty class is
/// an error. Symbolic links to files and class folders are followed; links to folders below a class
/// folder are not (no cycles). Errors are common::ConfigError naming the folder: not a folder,
/// no class subfolders, a class folder with no image (named), a given class with no folder, a
/// class name given twice, empty, "." or "..", or holding a '/'. Blocks on the file system; reads
/// no image.
ImageFolder scan_image_folder(const std::string& dir,
                              const std::vector<std::string>& class_names = {});

struct ImageLoadOptions {
  ColorMode color_mode = ColorMode::kRgb;
  std::optional<ImageSize> image_size;  ///< resize every image to this; none: all must match
  int threads = 1;                      ///< decoding threads, at least 1
  /// Most bytes the decoded images may take together (count x height x width x channels),
  /// checked before any image is decoded; folder_dataset.h passes the machine's memory.
  uint64_t max_total_bytes = UINT64_MAX;
};

/// Decoded images, N x H x W x C uint8, and their labels.
struct ImageArray {
  int64_t count = 0;
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  ///< count * height * width * channels bytes
  std::vector<int32_t> labels;  ///< count labels
};

/// Decodes folder.files[indices[i]] into image i (all files when indices is not given), with
/// decode_image_file (image_decode.h). Without options.image_size every image must have the size
/// in the first one's header (read_image_dimensions: read before any image is decoded). ConfigError
/// naming folder.dir when the images would take more than options.max_total_bytes, before any
/// is decoded. options.threads threads take images in index order and write each to its own
/// slot, so the result does not depend on the thread count; after an error no further image is
/// started, and the error thrown is the one of the lowest failing index, whatever the timing:
/// common::ConfigError naming the file (decode errors, or "image is HxW, expected HxW as <first
/// file>"). Blocks until every thread is joined; an index out of range is a bug (EnforceError).
ImageArray load_images(const ImageFolder& folder, const ImageLoadOptions& options,
                       const std::optional<std::vector<size_t>>& indices = std::nullopt);

}  // namespace dtrain::data
