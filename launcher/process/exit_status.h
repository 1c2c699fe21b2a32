// How a worker ended and what that means (docs/design.md#exit-codes): finished, configuration
// error, preempted, crashed or failed. Pure functions; deciding what to do next is
// restart_policy's.
#pragma once

#include <string>

namespace dtrain::launcher {

struct ExitStatus {
  bool signaled = false;  ///< killed by a signal (signal is set) rather than exited (code is set)
  int code = 0;
  int signal = 0;

  static ExitStatus exited(int code) { return {false, code, 0}; }
  static ExitStatus killed(int signal) { return {true, 0, signal}; }
  /// From a waitpid() status word; one that is no end (stopped, still running) is exit -1.
  static ExitStatus from_wait_status(int status);
  /// The shell's convention: the code, or 128 + signal (common::kExitSignalBase).
  int shell_code() const { return signaled ? 128 + signal : code; }
};

enum class Outcome {
  kSuccess,      ///< exit 0
  kConfigError,  ///< exit 2: no restart
  kPreempted,    ///< 143, 42, 130, 137, or SIGTERM/SIGKILL/SIGINT/SIGHUP: restart, own budget
  kCrashed,      ///< SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL (or 134/139 from a shell)
  kFailed,       ///< anything else
  kNonFinite,    ///< exit 4: dtrain-worker's TerminateOnNaN; no restart
};

Outcome classify(const ExitStatus& status);

/// The launcher's exit code when this end fails the job: 2 for a configuration error, else
/// shell_code().
int job_exit_code(const ExitStatus& status);

/// Death by SIGKILL, or exit 137 (SIGKILL from a shell): what the kernel's OOM killer leaves, as
/// well as a preemption's hard kill.
bool killed_by_sigkill(const ExitStatus& status);

/// "SIGSEGV", "SIGTERM", or "signal 42" for unnamed ones.
std::string signal_name(int signal);

/// "exit code 3", "killed by SIGSEGV", "exit code 139 (SIGSEGV from a shell)".
std::string describe(const ExitStatus& status);

/// "succeeded", "configuration error", "preempted", "crashed", "failed".
const char* outcome_name(Outcome outcome);

}  // namespace dtrain::launcher
