// See gpu_count.h. Reads a folder listing and a string; no CUDA, no child process.
#include "common/gpu_count.h"

#include <algorithm>
#include <filesystem>

namespace dtrain::common {
namespace fs = std::filesystem;
namespace {

std::string_view trim_spaces(std::string_view text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  size_t end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

bool is_gpu_uuid(std::string_view entry) {
  return entry.size() > 4 && (entry.substr(0, 4) == "GPU-" || entry.substr(0, 4) == "MIG-");
}

// The entries of a CUDA_VISIBLE_DEVICES value, split at commas, spaces trimmed.
std::vector<std::string> split_entries(const std::string& value) {
  std::vector<std::string> entries;
  size_t start = 0;
  while (true) {
    size_t comma = value.find(',', start);
    std::string_view piece(value.data() + start,
                           (comma == std::string::npos ? value.size() : comma) - start);
    entries.emplace_back(trim_spaces(piece));
    if (comma == std::string::npos) return entries;
    start = comma + 1;
  }
}

}  // namespace

int count_driver_gpus(const std::string& proc_root) {
  std::error_code ec;
  fs::directory_iterator it(fs::path(proc_root) / "driver" / "nvidia" / "gpus", ec);
  if (ec) return 0;
  int count = 0;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    std::error_code type_ec;
    if (it->is_directory(type_ec)) ++count;
  }
  return count;
}

std::optional<int> parse_gpu_index(std::string_view entry) {
  if (entry.empty() || entry.size() > 9) return std::nullopt;
  int index = 0;
  for (char ch : entry) {
    if (ch < '0' || ch > '9') return std::nullopt;
    index = index * 10 + (ch - '0');
  }
  return index;
}

std::vector<std::string> visible_gpu_names(const std::optional<std::string>& cuda_visible_devices,
                                           int device_count) {
  std::vector<std::string> names;
  if (!cuda_visible_devices) {
    for (int i = 0; i < device_count; ++i) names.push_back(std::to_string(i));
    return names;
  }
  for (const std::string& entry : split_entries(*cuda_visible_devices)) {
    if (static_cast<int>(names.size()) >= device_count) break;
    std::optional<int> index = parse_gpu_index(entry);
    bool valid = index ? *index < device_count : is_gpu_uuid(entry);
    bool repeated = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return name == entry || (index && parse_gpu_index(name) == index);
    });
    if (!valid || repeated) break;  // CUDA ignores everything from the first invalid entry on
    names.push_back(entry);
  }
  return names;
}

int count_visible_gpus(const std::optional<std::string>& cuda_visible_devices,
                       const std::string& proc_root) {
  return static_cast<int>(
      visible_gpu_names(cuda_visible_devices, count_driver_gpus(proc_root)).size());
}

}  // namespace dtrain::common
