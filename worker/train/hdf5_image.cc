// See hdf5_image.h. The core driver keeps the whole file in memory (backing_store off) and
// H5Fget_file_image copies it out once everything is flushed. Every handle is closed by a guard;
// HDF5's own printing of its error stack is turned off around our calls and its innermost
// message goes into the IoError instead.
#include "worker/train/hdf5_image.h"

#include <hdf5.h>

#include <atomic>

#include "common/errors.h"

namespace dtrain::train {
namespace {

// Closes an HDF5 handle (H5Gclose, H5Dclose, ...) when it goes; never throws.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// The innermost (first pushed) message of the default error stack, or "".
herr_t take_first(unsigned n, const H5E_error2_t* error, void* out) {
  if (n == 0 && error->desc) *static_cast<std::string*>(out) = error->desc;
  return 0;
}

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_first, &detail);
  H5Eclear2(H5E_DEFAULT);
  throw common::IoError(
      fmt::format("{}: {}{}", label, what, detail.empty() ? "" : " (HDF5: " + detail + ")"));
}

// Silences HDF5's printing of error stacks while it lives (the message goes into the error).
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace

Hdf5Image::Hdf5Image(std::string label) : label_(std::move(label)) {
  QuietErrors quiet;
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (fapl.get() < 0 || H5Pset_fapl_core(fapl.get(), size_t{1} << 20, 0) < 0)
    fail(label_, "cannot set up HDF5's in-memory driver");
  // The core driver needs a name, unique among the files this process has open.
  static std::atomic<uint64_t> serial{0};
  const std::string name = fmt::format("dtrain-image-{}.h5", serial++);
  file_ = H5Fcreate(name.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get());
  if (file_ < 0) fail(label_, "cannot create an HDF5 file in memory");
}

Hdf5Image::~Hdf5Image() {
  if (file_ >= 0) H5Fclose(file_);
}

void Hdf5Image::add_group(const std::string& path) {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  QuietErrors quiet;
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);  // missing groups above, as h5py makes them
  if (lcpl.get() < 0 || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0)
    fail(label_, "cannot make a link creation property list");
  Handle group(H5Gcreate2(file_, path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (group.get() < 0) fail(label_, fmt::format("cannot create the group {}", path));
}

void Hdf5Image::set_attribute(const std::string& path, const std::string& key,
                              const std::string& value) {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  QuietErrors quiet;
  Handle group(H5Gopen2(file_, path.empty() ? "/" : path.c_str(), H5P_DEFAULT), H5Gclose);
  if (group.get() < 0) fail(label_, fmt::format("cannot open the group {}", path));
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (type.get() < 0 || H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
      H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    fail(label_, "cannot make a UTF-8 string type");
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(
      H5Acreate2(group.get(), key.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  const char* text = value.c_str();
  if (space.get() < 0 || attribute.get() < 0 || H5Awrite(attribute.get(), type.get(), &text) < 0)
    fail(label_, fmt::format("cannot write the attribute {} of {}", key, path));
}

void Hdf5Image::add_dataset(const std::string& path, const std::vector<int64_t>& shape,
                            const float* data) {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  QuietErrors quiet;
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(shape.empty()
                   ? H5Screate(H5S_SCALAR)
                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose);
  if (space.get() < 0) fail(label_, fmt::format("cannot make the dataspace of {}", path));
  Handle dataset(H5Dcreate2(file_, path.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                            H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
  if (dataset.get() < 0) fail(label_, fmt::format("cannot create the dataset {}", path));
  if (H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail(label_, fmt::format("cannot write the dataset {}", path));
}

std::string Hdf5Image::finish() {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  QuietErrors quiet;
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(label_, "cannot flush the HDF5 file");
  const ssize_t size = H5Fget_file_image(file_, nullptr, 0);
  if (size <= 0) fail(label_, "cannot get the HDF5 file's size");
  std::string bytes(static_cast<size_t>(size), '\0');
  if (H5Fget_file_image(file_, bytes.data(), bytes.size()) != size)
    fail(label_, "cannot copy the HDF5 file out of memory");
  const herr_t closed = H5Fclose(file_);
  file_ = -1;
  if (closed < 0) fail(label_, "cannot close the HDF5 file");
  return bytes;
}

}  // namespace dtrain::train
