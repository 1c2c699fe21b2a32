// Zip archives (common/zip_reader.h: the directory, zip64 records, local headers, stored and
// deflated members) read from a memfd: every member the directory lists is found by its name,
// and what read_bytes accepts is as long as the directory says, with its CRC-32. Not checked
// here: what members hold (fuzz_npy.cc for .npz arrays).
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "common/zip_reader.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  const int fd = ::memfd_create("fuzz-zip", MFD_CLOEXEC);
  fuzz::require(fd >= 0, "memfd_create");
  fuzz::require(::write(fd, data, size) == static_cast<ssize_t>(size), "write to the memfd");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  fuzz::accepts([&] {
    common::ZipReader archive(path);
    for (const common::ZipMember& m : archive.members()) {
      fuzz::require(archive.find(m.name) == &m, "a listed member is found by its name");
      std::string bytes;
      if (!fuzz::accepts([&] { bytes = archive.read_bytes(m.name); })) continue;
      fuzz::require(bytes.size() == m.uncompressed, "a member is as long as the directory says");
      fuzz::require(
          common::zip_crc32(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == m.crc,
          "a member's CRC-32 is the directory's");
    }
  });
  ::close(fd);
  return 0;
}
