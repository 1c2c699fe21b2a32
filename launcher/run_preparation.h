// Everything `dtrain launch` does before the first worker starts: make the run directory, take
// its lock (one launcher per run), end stale workers a dead launcher left behind, resolve ports,
// write spec.json, and find the worker program. Also the log tail used by failure summaries.
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {

struct PreparedRun {
  common::RunDir run_dir{""};
  common::UniqueFd lock;  ///< flock held for the launcher's life
  LaunchContext context;  ///< control_address still empty
  int first_attempt = 0;  ///< 0, or one past the last attempt of a resumed run
};

/// Throws ConfigError when the run directory is in use by a live launcher (naming its pid) or
/// the worker program cannot be found; IoError when the folder cannot be written.
PreparedRun prepare_run(const common::JobSpec& spec);

/// Ends processes of an earlier launcher of run_dir that state.json lists as running, after
/// checking through /proc that each really belongs to this run. Returns how many it ended.
int end_stale_workers(const std::string& run_dir);

/// The last n lines of a file (fewer if it is shorter; none if unreadable).
std::vector<std::string> tail_lines(const std::string& path, size_t n);

}  // namespace dtrain::launcher
