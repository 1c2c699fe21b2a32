// `dtrain status` with no run named: one row per run folder under ./runs, from each launcher that
// answers, else from its state.json. A folder that cannot be read is a row that says why, never
// an error for the whole list.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launcher {

struct RunSummary {
  std::string dir;      ///< as listed: runs_root/NAME
  std::string state;    ///< the state JSON; "" when there is none
  bool daemon = false;  ///< a launcher answered (state is live)
  std::string problem;  ///< why state is empty: "never launched", "unreadable state.json: ..."
};

/// Every folder under runs_root, sorted by name. Asks each folder's launcher (up to
/// kReplySeconds each when one is connected but silent). Throws ConfigError when runs_root is not
/// a folder.
std::vector<RunSummary> list_runs(const std::string& runs_root);

/// A table: run, job, status, attempt, restarts (after failures), preemptions (restarts after
/// preemptions), launcher, progress, updated.
std::string format_run_table(const std::vector<RunSummary>& runs);

/// A JSON array: per run {"run_dir", "daemon": "running"|"gone", then the state's members}, or
/// {"run_dir", "daemon": "gone", "problem"} for a run without a readable state.
std::string format_run_json(const std::vector<RunSummary>& runs);

}  // namespace dtrain::launcher
