// See oom_watch.h. The cgroup folder is the mount point of the cgroup2 hierarchy (or of the v1
// hierarchy that has the memory controller) joined with the path /proc/self/cgroup gives.
#include "launcher/process/oom_watch.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

bool has_word(std::string_view list, std::string_view word) {
  for (std::string_view w : split(list, ','))
    if (w == word) return true;
  return false;
}

struct Mount {
  std::string root;   ///< the folder of the hierarchy mounted there
  std::string point;  ///< where it is mounted
};

// The cgroup2 mount (memory_v1 false) or the v1 mount with the memory controller.
std::optional<Mount> find_mount(std::string_view mountinfo, bool memory_v1) {
  for (std::string_view line : split(mountinfo, '\n')) {
    size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    std::vector<std::string_view> before = split(line.substr(0, dash), ' ');
    std::vector<std::string_view> after = split(line.substr(dash + 3), ' ');
    if (before.size() < 5 || after.size() < 3) continue;
    bool match =
        memory_v1 ? after[0] == "cgroup" && has_word(after[2], "memory") : after[0] == "cgroup2";
    if (match) return Mount{std::string(before[3]), std::string(before[4])};
  }
  return std::nullopt;
}

// "0::/a/b" (v2) or "4:memory:/a/b" (v1) from /proc/self/cgroup.
std::optional<std::string> cgroup_path(std::string_view proc_cgroup, bool memory_v1) {
  for (std::string_view line : split(proc_cgroup, '\n')) {
    std::vector<std::string_view> f = split(line, ':');
    if (f.size() < 3) continue;
    std::string path(line.substr(f[0].size() + f[1].size() + 2));
    if (memory_v1 ? has_word(f[1], "memory") : f[0] == "0" && f[1].empty()) return path;
  }
  return std::nullopt;
}

// The folder of path in the hierarchy mounted at mount: a mount of a sub-tree (a container's)
// holds the part of path below its root.
std::string cgroup_dir(const Mount& mount, const std::string& path) {
  std::string below = path;
  if (mount.root != "/" && below.rfind(mount.root, 0) == 0) below = below.substr(mount.root.size());
  return (fs::path(mount.point) / fs::path(below).relative_path()).lexically_normal().string();
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

}  // namespace

OomWatch OomWatch::for_this_process() {
  return from_proc_files(read_small_file("/proc/self/cgroup"),
                         read_small_file("/proc/self/mountinfo"));
}

OomWatch OomWatch::from_proc_files(std::string_view proc_cgroup, std::string_view mountinfo) {
  for (bool memory_v1 : {false, true}) {
    std::optional<Mount> mount = find_mount(mountinfo, memory_v1);
    std::optional<std::string> path = cgroup_path(proc_cgroup, memory_v1);
    if (!mount || !path) continue;
    OomWatch watch = for_cgroup(cgroup_dir(*mount, *path));
    if (watch.kills()) return watch;  // a v2 hierarchy without the memory controller: try v1
  }
  return OomWatch("");
}

OomWatch OomWatch::for_cgroup(const std::string& dir) {
  std::error_code ec;
  std::string events = (fs::path(dir) / "memory.events").string();
  if (fs::exists(events, ec)) return OomWatch(events);
  return OomWatch((fs::path(dir) / "memory.oom_control").string());
}

std::optional<uint64_t> OomWatch::kills() const {
  if (counter_file_.empty()) return std::nullopt;
  // Held here: a range-for keeps only split()'s vector alive, not the text its views point into.
  const std::string text = read_small_file(counter_file_);
  for (std::string_view line : split(text, '\n')) {
    constexpr std::string_view kKey = "oom_kill ";
    if (line.rfind(kKey, 0) != 0) continue;
    try {
      return std::stoull(std::string(line.substr(kKey.size())));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::string OomWatch::counter_name() const {
  return fs::path(counter_file_).filename().string() + " oom_kill";
}

std::optional<std::string> OomWatch::explain(const ExitStatus& status,
                                             std::optional<uint64_t> kills_at_spawn) const {
  if (!killed_by_sigkill(status)) return std::nullopt;
  return oom_kill_cause(status, kills_at_spawn, kills(), counter_name());
}

std::optional<std::string> oom_kill_cause(const ExitStatus& status, std::optional<uint64_t> before,
                                          std::optional<uint64_t> after, std::string_view counter) {
  if (!killed_by_sigkill(status) || !before || !after || *after <= *before) return std::nullopt;
  return fmt::format("killed by the kernel's OOM killer ({} rose)", counter);
}

}  // namespace dtrain::launcher
