// `dtrain agent`: the remote supervisor that the launcher starts as `ssh host dtrain agent`. It
// reads what to run from stdin, runs it in its own process group, frames the worker's output and
// control messages onto stdout, relays the worker's requests and the launcher's replies, forwards
// signal commands, reports the worker's /proc state and progress record every half second, and
// ends the group when the session closes. The wire format is agent_protocol.h. One thread, one
// poll() loop with time-outs; it signals only its worker (process or group), never by name.
#pragma once

#include "launcher/placement/agent_protocol.h"

namespace dtrain::launcher {

struct AgentOptions {
  double request_seconds = kAgentRequestSeconds;  ///< wait for the first stdin line
  double kill_after_seconds = 1.5;                ///< SIGTERM to SIGKILL when the session closes
  /// A stop signal to the agent itself is passed to the group, then SIGKILL this much later
  /// (time for a worker to save; the session closing still ends it kill_after_seconds later).
  double signal_grace_seconds = 1.5;
  /// With no stdin line for this long the session counts as closed (a cut network that ssh has
  /// not noticed yet); 0: wait for the end of stdin only. The launcher sends {"signal": 0} each
  /// second.
  double keepalive_seconds = 0;
};

/// Runs the agent on in_fd (commands) and out_fd (framed output) until the worker has ended and
/// its output is passed on (or, once the session closed, until the group is gone: at most
/// kill_after_seconds + 2 s). Returns the worker's exit code, or 128 + signal. Throws
/// ConfigError for a bad or missing first line (exit 2) or a program that cannot be found, and
/// IoError when the worker cannot be started or the agent is stopped before it started.
/// Blocks SIGCHLD, SIGHUP, SIGINT and SIGTERM while it runs (they arrive on a signalfd), and
/// ignores SIGPIPE. SIGHUP, SIGINT and SIGTERM to the agent are passed to the group and reported
/// (a "signaled" event); the group is SIGKILLed signal_grace_seconds later if it has not ended.
int run_agent(int in_fd, int out_fd, const AgentOptions& options);

}  // namespace dtrain::launcher
