// See hdf5_image.h. The core driver keeps the whole file in memory (backing_store off) and
// H5Fget_file_image copies it out once everything is flushed. Every handle is closed by a guard;
// HDF5's own printing of its error stack is turned off around our calls and its innermost
// message goes into the IoError instead.
//
// libhdf5 is loaded when the first image is made (dlopen), not linked: it brings some thirty
// shared libraries of its own (curl, gnutls, krb5, ...), whose loading cost every worker start
// about 20 ms, a replacement's in a recovery included, for a file only a Keras model's final save
// writes (docs/design.md#the-model-as-a-graph). hdf5.h gives the declarations; no macro that
// names a library symbol (H5P_FILE_ACCESS, H5T_NATIVE_FLOAT, H5F_ACC_EXCL, ...) is used.
#include "worker/train/hdf5_image.h"

#include <dlfcn.h>
#include <hdf5.h>

#include <atomic>

#include "common/errors.h"

namespace dtrain::train {
namespace {

constexpr unsigned kAccessExclusive = 0x0004u;  // H5F_ACC_EXCL

// The functions and the predefined identifiers this file uses, from the loaded library.
struct Hdf5 {
  decltype(&::H5Pcreate) Pcreate;
  decltype(&::H5Pclose) Pclose;
  decltype(&::H5Pset_fapl_core) Pset_fapl_core;
  decltype(&::H5Pset_create_intermediate_group) Pset_create_intermediate_group;
  decltype(&::H5Fcreate) Fcreate;
  decltype(&::H5Fclose) Fclose;
  decltype(&::H5Fflush) Fflush;
  decltype(&::H5Fget_file_image) Fget_file_image;
  decltype(&::H5Gcreate2) Gcreate2;
  decltype(&::H5Gopen2) Gopen2;
  decltype(&::H5Gclose) Gclose;
  decltype(&::H5Tcopy) Tcopy;
  decltype(&::H5Tset_size) Tset_size;
  decltype(&::H5Tset_cset) Tset_cset;
  decltype(&::H5Tclose) Tclose;
  decltype(&::H5Screate) Screate;
  decltype(&::H5Screate_simple) Screate_simple;
  decltype(&::H5Sclose) Sclose;
  decltype(&::H5Acreate2) Acreate2;
  decltype(&::H5Awrite) Awrite;
  decltype(&::H5Aclose) Aclose;
  decltype(&::H5Dcreate2) Dcreate2;
  decltype(&::H5Dwrite) Dwrite;
  decltype(&::H5Dclose) Dclose;
  decltype(&::H5Ewalk2) Ewalk2;
  decltype(&::H5Eclear2) Eclear2;
  decltype(&::H5Eget_auto2) Eget_auto2;
  decltype(&::H5Eset_auto2) Eset_auto2;
  // Predefined identifiers, valid once H5open has run.
  hid_t file_access = -1, link_create = -1, c_s1 = -1, ieee_f32le = -1, native_float = -1;
};

// libhdf5 loaded; IoError naming it when it or one of its symbols is missing.
Hdf5 load_library() {
  void* library = ::dlopen(DTRAIN_HDF5_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    throw common::IoError(fmt::format("cannot load {} (HDF5, which writes model.keras): {}",
                                      DTRAIN_HDF5_SONAME, ::dlerror()));
  }
  auto find = [&](const char* name) {
    void* symbol = ::dlsym(library, name);
    if (!symbol) throw common::IoError(fmt::format("{} has no {}", DTRAIN_HDF5_SONAME, name));
    return symbol;
  };
  Hdf5 h;
#define DT_HDF5_FUNCTION(field) h.field = reinterpret_cast<decltype(h.field)>(find("H5" #field))
  DT_HDF5_FUNCTION(Pcreate);
  DT_HDF5_FUNCTION(Pclose);
  DT_HDF5_FUNCTION(Pset_fapl_core);
  DT_HDF5_FUNCTION(Pset_create_intermediate_group);
  DT_HDF5_FUNCTION(Fcreate);
  DT_HDF5_FUNCTION(Fclose);
  DT_HDF5_FUNCTION(Fflush);
  DT_HDF5_FUNCTION(Fget_file_image);
  DT_HDF5_FUNCTION(Gcreate2);
  DT_HDF5_FUNCTION(Gopen2);
  DT_HDF5_FUNCTION(Gclose);
  DT_HDF5_FUNCTION(Tcopy);
  DT_HDF5_FUNCTION(Tset_size);
  DT_HDF5_FUNCTION(Tset_cset);
  DT_HDF5_FUNCTION(Tclose);
  DT_HDF5_FUNCTION(Screate);
  DT_HDF5_FUNCTION(Screate_simple);
  DT_HDF5_FUNCTION(Sclose);
  DT_HDF5_FUNCTION(Acreate2);
  DT_HDF5_FUNCTION(Awrite);
  DT_HDF5_FUNCTION(Aclose);
  DT_HDF5_FUNCTION(Dcreate2);
  DT_HDF5_FUNCTION(Dwrite);
  DT_HDF5_FUNCTION(Dclose);
  DT_HDF5_FUNCTION(Ewalk2);
  DT_HDF5_FUNCTION(Eclear2);
  DT_HDF5_FUNCTION(Eget_auto2);
  DT_HDF5_FUNCTION(Eset_auto2);
#undef DT_HDF5_FUNCTION
  // What the linked program's H5check and H5open macros do: refuse a library of another version
  // than these headers', then initialize it (the predefined identifiers are set then).
  auto check_version = reinterpret_cast<decltype(&::H5check_version)>(find("H5check_version"));
  auto open = reinterpret_cast<decltype(&::H5open)>(find("H5open"));
  if (check_version(H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE) < 0 || open() < 0)
    throw common::IoError(fmt::format("{} did not start", DTRAIN_HDF5_SONAME));
  auto id = [&](const char* name) { return *static_cast<const hid_t*>(find(name)); };
  h.file_access = id("H5P_CLS_FILE_ACCESS_ID_g");
  h.link_create = id("H5P_CLS_LINK_CREATE_ID_g");
  h.c_s1 = id("H5T_C_S1_g");
  h.ieee_f32le = id("H5T_IEEE_F32LE_g");
  h.native_float = id("H5T_NATIVE_FLOAT_g");
  return h;
}

// The library, loaded at the first call (thread-safe; a call after a failed load tries again, as
// a static whose initializer threw is initialized anew).
const Hdf5& hdf5() {
  static const Hdf5 loaded = load_library();
  return loaded;
}

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
  hdf5().Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_first, &detail);
  hdf5().Eclear2(H5E_DEFAULT);
  throw common::IoError(
      fmt::format("{}: {}{}", label, what, detail.empty() ? "" : " (HDF5: " + detail + ")"));
}

// Silences HDF5's printing of error stacks while it lives (the message goes into the error).
class QuietErrors {
 public:
  QuietErrors() {
    hdf5().Eget_auto2(H5E_DEFAULT, &func_, &data_);
    hdf5().Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { hdf5().Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace

void load_hdf5() {
  hdf5();
}

Hdf5Image::Hdf5Image(std::string label) : label_(std::move(label)) {
  const Hdf5& h = hdf5();
  QuietErrors quiet;
  Handle fapl(h.Pcreate(h.file_access), h.Pclose);
  if (fapl.get() < 0 || h.Pset_fapl_core(fapl.get(), size_t{1} << 20, 0) < 0)
    fail(label_, "cannot set up HDF5's in-memory driver");
  // The core driver needs a name, unique among the files this process has open.
  static std::atomic<uint64_t> serial{0};
  const std::string name = fmt::format("dtrain-image-{}.h5", serial++);
  file_ = h.Fcreate(name.c_str(), kAccessExclusive, H5P_DEFAULT, fapl.get());
  if (file_ < 0) fail(label_, "cannot create an HDF5 file in memory");
}

Hdf5Image::~Hdf5Image() {
  if (file_ >= 0) hdf5().Fclose(file_);
}

void Hdf5Image::add_group(const std::string& path) {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  const Hdf5& h = hdf5();
  QuietErrors quiet;
  Handle lcpl(h.Pcreate(h.link_create), h.Pclose);  // missing groups above, as h5py makes them
  if (lcpl.get() < 0 || h.Pset_create_intermediate_group(lcpl.get(), 1) < 0)
    fail(label_, "cannot make a link creation property list");
  Handle group(h.Gcreate2(file_, path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), h.Gclose);
  if (group.get() < 0) fail(label_, fmt::format("cannot create the group {}", path));
}

void Hdf5Image::set_attribute(const std::string& path, const std::string& key,
                              const std::string& value) {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  const Hdf5& h = hdf5();
  QuietErrors quiet;
  Handle group(h.Gopen2(file_, path.empty() ? "/" : path.c_str(), H5P_DEFAULT), h.Gclose);
  if (group.get() < 0) fail(label_, fmt::format("cannot open the group {}", path));
  Handle type(h.Tcopy(h.c_s1), h.Tclose);
  if (type.get() < 0 || h.Tset_size(type.get(), H5T_VARIABLE) < 0 ||
      h.Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    fail(label_, "cannot make a UTF-8 string type");
  Handle space(h.Screate(H5S_SCALAR), h.Sclose);
  Handle attribute(
      h.Acreate2(group.get(), key.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
      h.Aclose);
  const char* text = value.c_str();
  if (space.get() < 0 || attribute.get() < 0 || h.Awrite(attribute.get(), type.get(), &text) < 0)
    fail(label_, fmt::format("cannot write the attribute {} of {}", key, path));
}

void Hdf5Image::add_dataset(const std::string& path, const std::vector<int64_t>& shape,
                            const float* data) {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  const Hdf5& h = hdf5();
  QuietErrors quiet;
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(shape.empty()
                   ? h.Screate(H5S_SCALAR)
                   : h.Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               h.Sclose);
  if (space.get() < 0) fail(label_, fmt::format("cannot make the dataspace of {}", path));
  Handle dataset(h.Dcreate2(file_, path.c_str(), h.ieee_f32le, space.get(), H5P_DEFAULT,
                            H5P_DEFAULT, H5P_DEFAULT),
                 h.Dclose);
  if (dataset.get() < 0) fail(label_, fmt::format("cannot create the dataset {}", path));
  if (h.Dwrite(dataset.get(), h.native_float, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail(label_, fmt::format("cannot write the dataset {}", path));
}

std::string Hdf5Image::finish() {
  DT_ENFORCE(file_ >= 0, "the HDF5 image {} is finished", label_);
  const Hdf5& h = hdf5();
  QuietErrors quiet;
  if (h.Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail(label_, "cannot flush the HDF5 file");
  const ssize_t size = h.Fget_file_image(file_, nullptr, 0);
  if (size <= 0) fail(label_, "cannot get the HDF5 file's size");
  std::string bytes(static_cast<size_t>(size), '\0');
  if (h.Fget_file_image(file_, bytes.data(), bytes.size()) != size)
    fail(label_, "cannot copy the HDF5 file out of memory");
  const herr_t closed = h.Fclose(file_);
  file_ = -1;
  if (closed < 0) fail(label_, "cannot close the HDF5 file");
  return bytes;
}

}  // namespace dtrain::train
