// The exit-code table of docs/design.md#exit-codes.
#include "launcher/process/exit_status.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <csignal>

#include "common/exit_codes.h"

namespace dtrain::launcher {

ExitStatus ExitStatus::from_wait_status(int status) {
  if (WIFSIGNALED(status)) return killed(WTERMSIG(status));
  if (WIFEXITED(status)) return exited(WEXITSTATUS(status));
  return exited(-1);  // stopped or still running: not an end, and its bits are no exit code
}

Outcome classify(const ExitStatus& status) {
  if (status.signaled) {
    switch (status.signal) {
      case SIGTERM:
      case SIGKILL:
      case SIGINT:
      case SIGHUP:
        return Outcome::kPreempted;
      case SIGSEGV:
      case SIGABRT:
      case SIGBUS:
      case SIGFPE:
      case SIGILL:
        return Outcome::kCrashed;
      default:
        return Outcome::kFailed;
    }
  }
  switch (status.code) {
    case common::kExitSuccess:
      return Outcome::kSuccess;
    case common::kExitConfig:
      return Outcome::kConfigError;
    case common::kExitNonFinite:
      return Outcome::kNonFinite;
    case common::kExitPreempted:
    case common::kExitTensorFlowPreempted:
    case common::kExitInterrupted:
    case common::kExitKilled:
      return Outcome::kPreempted;
    case common::kExitSignalBase + SIGABRT:
    case common::kExitSignalBase + SIGSEGV:
      return Outcome::kCrashed;
    default:
      return Outcome::kFailed;
  }
}

int job_exit_code(const ExitStatus& status) {
  return classify(status) == Outcome::kConfigError ? common::kExitConfig : status.shell_code();
}

bool killed_by_sigkill(const ExitStatus& status) {
  return status.signaled ? status.signal == SIGKILL : status.code == common::kExitKilled;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    default:
      return fmt::format("signal {}", signal);
  }
}

std::string describe(const ExitStatus& status) {
  if (status.signaled) return "killed by " + signal_name(status.signal);
  if (status.code > common::kExitSignalBase && status.code < common::kExitSignalBase + 32 &&
      classify(status) != Outcome::kFailed) {
    return fmt::format("exit code {} ({} from a shell)", status.code,
                       signal_name(status.code - common::kExitSignalBase));
  }
  return fmt::format("exit code {}", status.code);
}

const char* outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::kSuccess:
      return "succeeded";
    case Outcome::kConfigError:
      return "configuration error";
    case Outcome::kPreempted:
      return "preempted";
    case Outcome::kCrashed:
      return "crashed";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kNonFinite:
      return "non-finite loss or weights";
  }
  return "failed";
}

}  // namespace dtrain::launcher
