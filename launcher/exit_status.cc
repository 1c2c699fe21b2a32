// The exit-code table of docs/design.md#exit-codes.
#include "launcher/exit_status.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <csignal>

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
    case 0:
      return Outcome::kSuccess;
    case 2:
      return Outcome::kConfigError;
    case 143:
    case 42:
    case 130:
    case 137:
      return Outcome::kPreempted;
    case 134:
    case 139:
      return Outcome::kCrashed;
    default:
      return Outcome::kFailed;
  }
}

int job_exit_code(const ExitStatus& status) {
  return classify(status) == Outcome::kConfigError ? 2 : status.shell_code();
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
  if (status.code > 128 && status.code < 160 && classify(status) != Outcome::kFailed) {
    return fmt::format("exit code {} ({} from a shell)", status.code,
                       signal_name(status.code - 128));
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
  }
  return "failed";
}

}  // namespace dtrain::launcher
