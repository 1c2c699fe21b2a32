// Which run a client command (logs, status, stop) means: a run directory, a job file (its
// run_dir), or with no argument the only run under ./runs.
#pragma once

#include <string>

namespace dtrain::launcher {

/// Throws ConfigError "<command>: ..." when the run cannot be found.
std::string resolve_run_dir(const std::string& target, const char* command);

}  // namespace dtrain::launcher
