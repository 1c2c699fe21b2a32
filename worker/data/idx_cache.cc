// See idx_cache.h.
#include "worker/data/idx_cache.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>

#include "common/atomic_file.h"

namespace dtrain::data {

std::optional<std::string> idx_cache_dir() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? value : "";
  };
  std::string dir = env("DTRAIN_CACHE_DIR");
  if (dir == "off") return std::nullopt;
  if (!dir.empty()) return dir;
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/dtrain";
  if (!env("HOME").empty()) return env("HOME") + "/.cache/dtrain";
  return std::nullopt;
}

std::optional<std::string> idx_cache_path(const std::string& dir, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  std::string name = std::filesystem::path(path).filename().string();
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".gz") == 0) name.resize(name.size() - 3);
  return fmt::format("{}/{}.{:x}-{:x}-{}-{}.{:09}", dir, name, st.st_dev, st.st_ino, st.st_size,
                     st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

bool store_idx_cache(const std::string& cache_file, const std::string& bytes) {
  try {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(cache_file).parent_path(), ec);
    common::write_file_atomically(cache_file, bytes);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace dtrain::data
