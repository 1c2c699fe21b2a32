// IDX files, raw or gzip (worker/data/idx_file.h), read from a memfd so no disk is touched: what
// read_idx accepts holds exactly the bytes its header promises.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "test/fuzz/fuzz_support.h"
#include "worker/data/idx_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  // Decompressed copies go to a cache (idx_cache.h): one of this process's, removed at exit.
  static const bool cache_set = [] {
    static const std::string* dir =  // never freed: the exit handler uses it
        new std::string("/tmp/dtrain-fuzz-idx-cache-" + std::to_string(::getpid()));
    std::atexit([] { std::filesystem::remove_all(*dir); });
    return ::setenv("DTRAIN_CACHE_DIR", dir->c_str(), 1) == 0;
  }();
  fuzz::require(cache_set, "setenv DTRAIN_CACHE_DIR");
  const int fd = ::memfd_create("fuzz-idx", MFD_CLOEXEC);
  fuzz::require(fd >= 0, "memfd_create");
  fuzz::require(::write(fd, data, size) == static_cast<ssize_t>(size), "write to the memfd");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  for (data::IdxKind kind : {data::IdxKind::kImages, data::IdxKind::kLabels}) {
    data::IdxArray array;
    if (!fuzz::accepts([&] { array = data::read_idx(path, kind); })) continue;
    size_t product = 1;
    for (int64_t d : array.dims) product *= static_cast<size_t>(d);
    fuzz::require(!array.dims.empty() && product == array.data.size(),
                  "an accepted IDX file holds what its header promises");
  }
  ::close(fd);
  return 0;
}
