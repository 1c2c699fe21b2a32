// See image_folder.h. The scan uses std::filesystem only; decoding is image_decode.h's. The pool
// is plain std::threads started per call and joined before it returns (a load is rare and long:
// no pool outlives it). Threads share only an atomic "next index" and an atomic "lowest failing
// index"; each writes its own slots of the output and of the error list.
#include "worker/data/image_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <thread>
#include <utility>

#include "common/errors.h"

namespace dtrain::data {
namespace {

namespace fs = std::filesystem;
using common::ConfigError;

[[noreturn]] void fail(const std::string& dir, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", dir, what));
}

bool hidden(const std::string& name) {
  return !name.empty() && name[0] == '.';
}

bool image_name(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* ext : {".png", ".jpg", ".jpeg"}) {
    const size_t n = std::strlen(ext);
    if (name.size() > n && name.compare(name.size() - n, n, ext) == 0) return true;
  }
  return false;
}

// Whether text is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
// U+10FFFF), as every JSON and safetensors reader requires of the names written to model.json.
bool valid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto byte = [&](size_t at) { return static_cast<unsigned char>(text[at]); };
    const unsigned char lead = byte(i);
    const size_t length = lead < 0x80                    ? 1
                          : lead >= 0xc2 && lead <= 0xdf ? 2
                          : lead >= 0xe0 && lead <= 0xef ? 3
                          : lead >= 0xf0 && lead <= 0xf4 ? 4
                                                         : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k)
      if ((byte(i + k) & 0xc0) != 0x80) return false;
    const unsigned char second = length > 1 ? byte(i + 1) : 0x80;
    if ((lead == 0xe0 && second < 0xa0) || (lead == 0xed && second > 0x9f) ||
        (lead == 0xf0 && second < 0x90) || (lead == 0xf4 && second > 0x8f))
      return false;
    i += length;
  }
  return true;
}

// text with bytes outside printable ASCII written as \xNN, for a message about a bad name.
std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto value = static_cast<unsigned char>(c);
    out += value >= 0x20 && value < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", value);
  }
  return out;
}

bool is_folder(const fs::path& path) {
  std::error_code ignored;
  return fs::is_directory(path, ignored);  // follows symbolic links
}

// Subfolders of dir that are not hidden, sorted by name.
std::vector<std::string> class_folders(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!hidden(name) && is_folder(it->path())) names.push_back(name);
  }
  if (error) fail(dir, fmt::format("cannot list the folder ({})", error.message()));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {  // the first in sorted order, whatever the listing's
    if (!valid_utf8(name)) {
      fail(dir, fmt::format("class folder \"{}\" has a name that is not UTF-8 (class names are "
                            "written to model.json and the checkpoints as UTF-8): rename it",
                            escaped(name)));
    }
  }
  return names;
}

// Image files under class_dir in Keras's order: by folder path, then by name.
std::vector<std::string> class_images(const fs::path& class_dir) {
  std::vector<std::pair<std::string, std::string>> found;  // (folder, name)
  std::error_code error;
  for (fs::recursive_directory_iterator it(class_dir, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (hidden(name)) {
      if (it->is_directory(error)) it.disable_recursion_pending();
      continue;
    }
    if (image_name(name) && !is_folder(it->path()))
      found.emplace_back(it->path().parent_path().string(), name);
  }
  if (error) fail(class_dir.string(), fmt::format("cannot list the folder ({})", error.message()));
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (const auto& [folder, name] : found) paths.push_back(folder + "/" + name);
  return paths;
}

void check_class_names(const std::string& dir, const std::vector<std::string>& names) {
  std::set<std::string> seen;
  for (const std::string& name : names) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      fail(dir, fmt::format("class name \"{}\" is not a folder name", name));
    if (!seen.insert(name).second) fail(dir, fmt::format("class \"{}\" is given twice", name));
    if (!is_folder(fs::path(dir) / name))
      fail(dir, fmt::format("class \"{}\" has no folder {}/{}", name, dir, name));
  }
}

// Runs decode_one(i) for every i in [begin, end) on threads threads, in index order; after a
// failure no index above it starts. Rethrows the error of the lowest failing index.
void run_in_order(size_t begin, size_t end, int threads,
                  const std::function<void(size_t)>& decode_one) {
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::atomic<size_t> next{begin};
  std::atomic<size_t> first_failure{kNone};
  std::vector<std::exception_ptr> errors(end);
  auto work = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= end || i > first_failure.load()) return;
      try {
        decode_one(i);
      } catch (...) {
        errors[i] = std::current_exception();
        size_t lowest = first_failure.load();
        while (i < lowest && !first_failure.compare_exchange_weak(lowest, i)) {
        }
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  } catch (...) {  // no thread could be started: stop those that were, then report it
    next.store(end);
    for (std::thread& thread : pool) thread.join();
    throw;
  }
  work();
  for (std::thread& thread : pool) thread.join();
  if (first_failure.load() != kNone) std::rethrow_exception(errors[first_failure.load()]);
}

// Indices into folder.files: indices, checked, or all of them.
std::vector<size_t> chosen_files(const ImageFolder& folder,
                                 const std::optional<std::vector<size_t>>& indices) {
  if (!indices) {
    std::vector<size_t> all(folder.files.size());
    std::iota(all.begin(), all.end(), size_t{0});
    return all;
  }
  for (size_t index : *indices)
    DT_ENFORCE(index < folder.files.size(), "image {} of {}", index, folder.files.size());
  return *indices;
}

}  // namespace

ImageFolder scan_image_folder(const std::string& dir, const std::vector<std::string>& class_names) {
  if (!is_folder(dir)) fail(dir, "not a folder (image data needs one subfolder per class)");
  ImageFolder folder;
  folder.dir = dir;
  if (class_names.empty()) {
    folder.class_names = class_folders(dir);
    if (folder.class_names.empty())
      fail(dir, "no class subfolders (image data needs one subfolder per class)");
  } else {
    check_class_names(dir, class_names);
    folder.class_names = class_names;
  }
  for (size_t label = 0; label < folder.class_names.size(); ++label) {
    const std::string& name = folder.class_names[label];
    const std::vector<std::string> paths = class_images(fs::path(dir) / name);
    if (paths.empty())
      fail(dir, fmt::format("class folder \"{}\" holds no .png, .jpg or .jpeg file", name));
    for (const std::string& path : paths) folder.files.push_back({path, static_cast<int>(label)});
  }
  return folder;
}

ImageArray load_images(const ImageFolder& folder, const ImageLoadOptions& options,
                       const std::optional<std::vector<size_t>>& indices) {
  DT_ENFORCE(options.threads >= 1, "threads is {}", options.threads);
  const std::vector<size_t> chosen = chosen_files(folder, indices);
  ImageArray out;
  out.count = static_cast<int64_t>(chosen.size());
  out.channels = channel_count(options.color_mode);
  for (size_t index : chosen) out.labels.push_back(folder.files[index].label);
  if (chosen.empty()) return out;
  // Without image_size the first image's header sets the size the others must have.
  if (options.image_size) {
    if (options.image_size->height <= 0 || options.image_size->width <= 0) {
      fail(folder.dir, fmt::format("image_size {}x{} is not positive", options.image_size->height,
                                   options.image_size->width));
    }
    out.height = options.image_size->height;
    out.width = options.image_size->width;
  } else {
    const ImageSize first = read_image_dimensions(folder.files[chosen[0]].path);
    out.height = first.height;
    out.width = first.width;
  }
  const uint64_t slot = static_cast<uint64_t>(out.height) * static_cast<uint64_t>(out.width) *
                        static_cast<uint64_t>(out.channels);
  const std::string& first_path = folder.files[chosen[0]].path;
  if (!options.image_size && slot > kMaxImageBytes) {
    fail(first_path, fmt::format("image of {}x{}x{} is {} bytes, more than the {}-byte limit",
                                 out.height, out.width, out.channels, slot, kMaxImageBytes));
  }
  uint64_t total = 0;
  const bool overflow = __builtin_mul_overflow(slot, uint64_t{chosen.size()}, &total);
  if (overflow || total > options.max_total_bytes) {
    fail(folder.dir,
         fmt::format("{} images of {}x{}x{} take {} bytes decoded, more than the {} bytes of "
                     "memory there are for them (give a smaller image_size, or shard_policy "
                     "\"file\" to share the files out among the workers)",
                     chosen.size(), out.height, out.width, out.channels,
                     overflow ? "more than 2^64" : std::to_string(total), options.max_total_bytes));
  }
  out.pixels.resize(static_cast<size_t>(total));
  const int threads = static_cast<int>(std::min<int64_t>(options.threads, out.count));
  run_in_order(0, chosen.size(), threads, [&](size_t i) {
    const std::string& path = folder.files[chosen[i]].path;
    Image image = decode_image_file(path, options.color_mode, options.image_size);
    if (image.height != out.height || image.width != out.width) {
      fail(path, fmt::format("image is {}x{}, expected {}x{} as {} (the first image; "
                             "give image_size to resize them all)",
                             image.height, image.width, out.height, out.width, first_path));
    }
    std::memcpy(out.pixels.data() + i * slot, image.pixels.data(), slot);
  });
  return out;
}

}  // namespace dtrain::data
