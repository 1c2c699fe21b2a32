// An HDF5 file built in memory through Debian's libhdf5 (its core driver, no backing file), for
// the weights of a Keras archive (worker/train/keras_archive.*): groups, variable-length UTF-8
// string attributes and float32 datasets, as h5py makes them for a str attribute and a float32
// array. Nothing else of HDF5 (chunks, filters, other types) and no reading. The only file that
// sees libhdf5, which it loads (dlopen) when the first image is made: the worker does not link
// it, so that a worker start does not load it and its dependencies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::train {

/// Loads libhdf5 now, if it is not loaded yet (a chief that will write model.keras, at its
/// start, so that a machine without it fails before training, not at the end). IoError naming
/// the library when it cannot be loaded. Thread-safe.
void load_hdf5();

/// Every call that fails throws IoError "<label>: <what failed> (HDF5: <its innermost message>)".
/// Single-threaded (it turns HDF5's error printing off around its calls, a process-wide setting).
class Hdf5Image {
 public:
  /// label names the file in messages ("run/model/model.keras: model.weights.h5").
  explicit Hdf5Image(std::string label);
  ~Hdf5Image();
  Hdf5Image(const Hdf5Image&) = delete;
  Hdf5Image& operator=(const Hdf5Image&) = delete;

  /// Creates the group at path ("layers/conv2d/vars"; "/"-separated, relative to the root),
  /// with the groups above it that do not exist yet.
  void add_group(const std::string& path);
  /// Sets a scalar variable-length UTF-8 string attribute on the group at path ("" is the root).
  void set_attribute(const std::string& path, const std::string& key, const std::string& value);
  /// Creates a contiguous little-endian float32 dataset at path (its group must exist) of this
  /// shape (empty: a scalar), holding data (row-major, the product of shape floats).
  void add_dataset(const std::string& path, const std::vector<int64_t>& shape, const float* data);
  /// The file's bytes. Ends the image: nothing may be added after.
  std::string finish();

 private:
  std::string label_;
  int64_t file_ = -1;  ///< hid_t of the open file; -1 once finished
};

}  // namespace dtrain::train
