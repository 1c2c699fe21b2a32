// See run_lookup.h.
#include "launcher/control/run_lookup.h"

#include <fmt/format.h>

#include <filesystem>
#include <vector>

#include "common/errors.h"
#include "common/job_spec.h"

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace {

// The only folder under ./runs; a ConfigError when there is none or more than one.
std::string default_run_dir(const char* command) {
  std::vector<std::string> runs;
  std::error_code ec;
  for (fs::directory_iterator it("runs", ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) runs.push_back(it->path().string());
  }
  if (runs.size() == 1) return runs[0];
  std::string found = ec ? "there is no ./runs" : fmt::format("./runs holds {} runs", runs.size());
  throw common::ConfigError(
      fmt::format("{}: which run? {}; give RUN_DIR or JOB_FILE (see dtrain {} --help)", command,
                  found, command));
}

}  // namespace

std::string resolve_run_dir(const std::string& target, const char* command) {
  if (target.empty()) return default_run_dir(command);
  std::error_code ec;
  bool job_file = target.size() > 5 && target.compare(target.size() - 5, 5, ".json") == 0 &&
                  fs::is_regular_file(target, ec);
  std::string run_dir = job_file ? common::load_job_spec(target).run_dir : target;
  if (!fs::is_directory(run_dir, ec)) {
    throw common::ConfigError(fmt::format("{}: {}: no such run directory", command, run_dir));
  }
  std::string absolute = fs::absolute(run_dir).lexically_normal().string();
  while (absolute.size() > 1 && absolute.back() == '/')
    absolute.pop_back();  // as the launcher names it
  return absolute;
}

}  // namespace dtrain::launcher
