// Starts one program the way both the launcher (local_spawner.cc) and `dtrain agent`
// (agent_child.cc) do: in its own process group or session, with its output on one pipe, a
// parent-death SIGKILL, and exec's errno reported back. It neither reads the output nor waits
// for the end; the callers do that their own way (Asio, or the agent's poll loop). Linux only.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/unique_fd.h"

namespace dtrain::launcher {

struct ProcessStart {
  /// argv[0]: a path (relative to cwd when it has no leading '/'), or a name looked up on the
  /// PATH of the environment the child gets (relative PATH entries: relative to cwd).
  std::vector<std::string> argv;
  /// Set on top of this process's environment; for a name given twice the last value wins.
  std::vector<std::pair<std::string, std::string>> env;
  std::string cwd;           ///< "" = this process's
  int stdin_fd = -1;         ///< -1: /dev/null; else a descriptor the child gets a copy of as stdin
  bool new_session = false;  ///< setsid() (the agent); else setpgid(0, 0): a new group only
};

struct StartedProcess {
  pid_t pid = -1;           ///< also the id of its process group (and session when new_session)
  common::UniqueFd output;  ///< read end of the child's stdout+stderr pipe, close-on-exec
};

/// Starts start.argv and returns once the program has been exec'd; the child is
/// then the caller's to reap. The child runs with no blocked signals and SIGPIPE at its default,
/// and gets SIGKILL when the thread that called this ends (PR_SET_PDEATHSIG).
/// Throws common::ConfigError when the program is not found (program_not_found_message()), is not
/// something exec can run, or cwd cannot be entered; common::IoError for anything else (no
/// descriptors or processes left, ...), naming the cause. Nothing is left behind when it throws.
/// Not async-signal-safe itself; vfork()s (the calling thread waits until the child has exec'd or
/// failed), so call it from a thread that may fork.
StartedProcess start_process(const ProcessStart& start);

/// The one message for a program that does not exist: `program "X" not found on PATH` for a name,
/// `program "X" does not exist` for a path.
std::string program_not_found_message(const std::string& program);

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (a launcher holds a few descriptors
/// per worker). Returns the new soft limit; a failure is not an error (the old limit stays).
unsigned long raise_open_file_limit();

}  // namespace dtrain::launcher
