// Checkpoint files a run finds on disk (worker/train/checkpoint.h): the safetensors header and
// data, and the backup folder's index (checkpoint.json) beside it. A file that decodes encodes
// to a file that decodes to the same tensors; the store never throws anything but its errors.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test/fuzz/fuzz_support.h"
#include "worker/train/checkpoint.h"

namespace {

// One folder per process for the index half, removed at exit (the path is never freed, so the
// exit handler may still use it).
const std::string& scratch_dir() {
  static const std::string* dir = [] {
    auto* path = new std::string(std::filesystem::temp_directory_path() /
                                 ("dtrain-fuzz-ckpt-" + std::to_string(::getpid())));
    std::filesystem::create_directories(*path);
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return path;
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  const std::string bytes(fuzz::as_text(data, size));
  train::SafetensorsFile file;
  if (fuzz::accepts([&] { file = train::decode_safetensors(bytes, "fuzz.safetensors"); })) {
    std::vector<train::TensorView> views;
    for (const auto& [name, tensor] : file.tensors)
      views.push_back({name, tensor.shape, tensor.data.data(), tensor.data.size()});
    std::map<std::string, std::string> metadata = file.metadata;
    metadata.erase("checksum");
    const std::string again = train::encode_safetensors(views, metadata);
    train::SafetensorsFile second;
    fuzz::require(fuzz::accepts([&] { second = train::decode_safetensors(again, "again"); }),
                  "an encoded checkpoint decodes");
    fuzz::require(second.tensors.size() == file.tensors.size(), "the same tensors come back");
  }
  // The same bytes as the folder's index, and as its newest checkpoint.
  std::ofstream(scratch_dir() + "/checkpoint.json", std::ios::binary) << bytes;
  std::ofstream(scratch_dir() + "/ckpt-0000000007.safetensors", std::ios::binary) << bytes;
  train::CheckpointStore store(scratch_dir(), 2);
  fuzz::accepts([&] { store.load_latest("{}"); });
  return 0;
}
