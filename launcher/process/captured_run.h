// Runs a short helper program to its end and keeps what it printed: `dtrain-worker check-data`
// for `dtrain validate` (launcher/cli/in_worker.h). Blocking, with a time-out; for commands that
// run before any event loop, never on one.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::launcher {

/// How a captured run ended, and its output.
struct CapturedRun {
  std::string command;  ///< "`argv...`", for messages
  int exit_code = 0;    ///< its exit status; -1 when a signal ended it
  int signal = 0;       ///< the signal that ended it, or 0
  std::string out;      ///< stdout, whole
  std::string err;      ///< stderr, trailing newlines dropped
  /// "exit 3" or "signal 9", for messages.
  std::string ending() const;
};

/// Runs argv (looked up on PATH when it has no '/') with stdin from /dev/null and this process's
/// environment plus env, to its end or timeout_seconds (then SIGKILL). Throws ConfigError when it
/// cannot be started (a missing program), IoError when it ran past its time.
CapturedRun run_captured(const std::vector<std::string>& argv,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         double timeout_seconds);

}  // namespace dtrain::launcher
