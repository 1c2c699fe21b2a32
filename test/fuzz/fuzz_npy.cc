// NumPy files (worker/data/npy_file.h, npz_file.h) read from a memfd, the same bytes as an .npy
// file and as an .npz archive: what is accepted holds exactly the data its header promises, and
// every byte of it can be read. Not checked here: the Dataset conversion (test/data).
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "test/fuzz/fuzz_support.h"
#include "worker/data/npy_file.h"
#include "worker/data/npz_file.h"

namespace {

void check(const dtrain::data::NpyArray& array) {
  using dtrain::fuzz::require;
  uint64_t product = 1;
  for (int64_t dim : array.shape) product *= static_cast<uint64_t>(dim);
  require(static_cast<uint64_t>(array.count) == product, "count is the product of the shape");
  require(array.bytes == product * static_cast<uint64_t>(dtrain::data::npy_itemsize(array.dtype)),
          "bytes is count * itemsize");
  require(array.bytes == 0 || array.data != nullptr, "data is there");
  unsigned sum = 0;  // every promised byte is readable (ASan or a fault says otherwise)
  for (uint64_t i = 0; i < array.bytes; ++i) sum += array.data.get()[i];
  require(sum <= 255 * array.bytes, "bytes are bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  const int fd = ::memfd_create("fuzz-npy", MFD_CLOEXEC);
  fuzz::require(fd >= 0, "memfd_create");
  fuzz::require(::write(fd, data, size) == static_cast<ssize_t>(size), "write to the memfd");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  data::NpyArray array;
  if (fuzz::accepts([&] { array = data::read_npy(path); })) check(array);
  fuzz::accepts([&] {
    data::NpzFile archive(path);
    for (const std::string& key : archive.keys()) {
      fuzz::require(archive.has(key), "a listed key is there");
      if (fuzz::accepts([&] { array = archive.read(key); })) check(array);
    }
  });
  ::close(fd);
  return 0;
}
