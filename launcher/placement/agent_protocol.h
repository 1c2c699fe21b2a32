// The wire format between the launcher and `dtrain agent` (the remote supervisor started as
// `ssh host /path/to/dtrain agent`), shared by both sides. Formatting and parsing only; the agent
// itself is agent.cc. Nothing secret ever travels on argv: it all goes over the session's stdin.
//
// Launcher -> agent (the agent's stdin), one JSON object per line, each at most kMaxAgentLine:
//   first line, within the agent's request time-out (30 s):
//     {"argv": ["prog", "arg", ...], "env": [["NAME", "value"], ...], "cwd": "/dir"}
//   argv is required and non-empty (argv[0] is looked up on PATH, the worker's PATH if env sets
//   it); env (added to the agent's own environment) and cwd ("" = the agent's) are optional.
//   DTRAIN_CONTROL in env is replaced by the agent's own socket, and DTRAIN_PROGRESS_FILE (any
//   value: the launcher's path is on its own host) by a file in the agent's private folder.
//   later lines, each one of
//     {"signal": 15}                    sends that signal to the worker's whole process group
//                                       ({"signal": 0}: a keep-alive only)
//     {"signal": 10, "value": 3}        queues that signal with that value (sigqueue) to the
//                                       worker process alone: the launcher's notice that the
//                                       group re-forms as generation 3
//                                       (docs/design.md#in-place-recovery)
//     {"reply": 7, "line": "{...}"}     writes line (and a newline) to the control connection
//                                       whose request was relayed with id 7 (below); dropped when
//                                       that connection has closed meanwhile, or for an id that
//                                       is not waiting (answered already, never given)
//   End of stdin (the session closed): the agent ends the group (SIGTERM, SIGKILL 1.5 s later).
//   SIGHUP, SIGINT or SIGTERM to the agent itself: it passes the signal to the group, reports
//   it (the "signaled" event below) and SIGKILLs the group --signal-grace seconds later (default
//   1.5; the launcher passes the job's grace_seconds, so a worker can save a checkpoint).
//
// Agent -> launcher (the agent's stdout): the worker's stdout+stderr bytes, unchanged but for
// kLineMarker (below), written only in whole lines (a line ends at '\n', or at a '\r' not followed
// by '\n', as progress bars redraw). Between two whole lines the agent may insert its own lines,
// each
//   kControlMarker + <a control message from the worker, common/control_protocol.h> + "\n"
//   kEventMarker + <an agent event> + "\n", the events being
//     {"event": "started", "pid": 1234}           the worker runs (its pid on that host)
//     {"event": "exit", "code": 3}                the worker exited with code 3
//     {"event": "exit", "signal": 9}              the worker was killed by signal 9
//     {"event": "signaled", "signal": 15}         the agent itself got signal 15 from someone
//                                                 other than the launcher (Slurm ending the
//                                                 step, a host shutting down); it passed it on
//     {"event": "watch", "state": "S", "cpu_ticks": 412, "record": {"pid": 1234, "generation": 0,
//      "begun": 10, "ended": 10, "global_step": 5, "step_micros": 21000}}
//                                                 every half second while the worker runs: its
//                                                 process state and CPU time (/proc) and, when
//                                                 the request's env names DTRAIN_PROGRESS_FILE,
//                                                 its progress record ("record" absent while
//                                                 there is none); what the launcher's freeze
//                                                 watch reads of a remote worker, and the
//                                                 agent's sign of life
//   kRequestMarker + <id> + " " + <a request from the worker> + "\n": a request line the worker
//     sent on DTRAIN_CONTROL ({"request": "reform", ...} or {"request": "spare", ...},
//     common/control_protocol.h) that waits for an answer; id (a number the agent chooses) names
//     its connection, which the agent keeps open for the {"reply": id, ...} command. The request
//     is re-written compactly, not checked further (the launcher answers a malformed one). At
//     most 64 wait at a time: one more closes its connection unanswered
// Markers begin with the byte 0x1e (ASCII record separator), and only the agent starts a line
// with it: a worker line that begins with 0x1e goes out as kLineMarker + <the line, byte for
// byte>, so a worker cannot fake an event (a fake "signaled" once made a Slurm launch exit 143),
// and classify_agent_line hands it back as that worker line. Only a line's start counts: a piece
// after a cut (below) is output whatever its first byte. A worker line longer than kMaxAgentLine is
// passed on in pieces, and markers then wait for its end. A last line without a newline is passed
// on when the output closes; it is then the last thing on stdout. The exit event may come before
// the last lines of output (a grandchild can keep writing); the agent's own exit status is the
// worker's exit code, or 128 + signal (the shell's convention), so launcher/process/exit_status.cc
// classifies the ssh status. Problems of the agent itself go to its stderr; a bad first line ends
// it with exit code 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launcher/process/exit_status.h"
#include "launcher/process/freeze_watch.h"

namespace dtrain::launcher {

/// Longest line the agent accepts on stdin, and longest worker line it passes on whole.
inline constexpr size_t kMaxAgentLine = 1 << 20;
/// The launcher sends a keep-alive ({"signal": 0}) to each agent this often, and starts agents
/// with --keepalive kAgentKeepaliveSeconds: a cut network ends the remote group that soon.
inline constexpr double kAgentKeepaliveInterval = 1.0;
inline constexpr double kAgentKeepaliveSeconds = 10.0;
/// Seconds the agent waits for its first stdin line.
inline constexpr double kAgentRequestSeconds = 30;
/// The first byte of every marker; a line that starts with it is never plain output.
inline constexpr char kMarkerByte = '\036';
/// Starts an agent stdout line that carries a worker's control message (\036 is 0x1e).
inline constexpr std::string_view kControlMarker = "\036dtrain-control ";
/// Starts an agent stdout line that carries an agent event.
inline constexpr std::string_view kEventMarker = "\036dtrain-agent ";
/// Starts an agent stdout line that relays a worker's request waiting for an answer.
inline constexpr std::string_view kRequestMarker = "\036dtrain-request ";
/// Starts an agent stdout line that carries a worker line beginning with kMarkerByte (escaped).
inline constexpr std::string_view kLineMarker = "\036dtrain-line ";

/// What the agent starts: the first stdin line.
struct AgentRequest {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string cwd;
};

/// Parses the first line (without its newline). Throws ConfigError naming the JSON path.
AgentRequest parse_agent_request(std::string_view line);
/// The first line, newline included.
std::string format_agent_request(const AgentRequest& request);

/// A later stdin line.
struct AgentCommand {
  enum class Kind { kSignal, kQueueSignal, kReply };
  Kind kind = Kind::kSignal;
  int signal = 0;    ///< kSignal (0: keep-alive), kQueueSignal (1..SIGRTMAX)
  int value = 0;     ///< kQueueSignal: the value queued with it
  uint64_t id = 0;   ///< kReply: the relayed request's id
  std::string line;  ///< kReply: the answer, without newline
};
/// Parses a later stdin line (without newline). Throws ConfigError naming what is wrong.
AgentCommand parse_agent_command(std::string_view line);
/// {"signal": N} and a newline.
std::string format_agent_signal_command(int sig);
/// {"signal": N, "value": V} and a newline.
std::string format_agent_queue_command(int sig, int value);
/// {"reply": id, "line": line} and a newline (line's own trailing newline dropped).
std::string format_agent_reply_command(uint64_t id, std::string_view line);

/// A relayed request: the payload after kRequestMarker.
struct RelayedRequest {
  uint64_t id = 0;
  std::string json;  ///< the worker's request line, without newline
};
/// "<id> <json>" (no marker, no newline).
std::string format_relayed_request(const RelayedRequest& request);
/// nullopt for anything malformed (no id, no JSON object after it).
std::optional<RelayedRequest> parse_relayed_request(std::string_view payload);

/// The JSON of an event (no marker, no newline).
std::string format_agent_started_event(int pid);
std::string format_agent_exit_event(const ExitStatus& status);
std::string format_agent_signaled_event(int sig);
std::string format_agent_watch_event(const ProcessSample& process,
                                     const std::optional<common::ProgressSample>& record);

/// What one line of agent stdout is. payload: the JSON after the marker (without newline) for
/// kControl and kEvent; for kOutput the worker's line as it wrote it (terminator included): the
/// whole line, or what follows kLineMarker; for kRequest what follows kRequestMarker.
struct AgentLine {
  enum class Kind { kOutput, kControl, kEvent, kRequest };
  Kind kind = Kind::kOutput;
  std::string_view payload;
};
/// line: one line as a LineSplitter hands it over (terminator included or not), starting a line
/// of the stream (a piece after a cut is output: the caller does not classify it).
AgentLine classify_agent_line(std::string_view line);

struct AgentEvent {
  enum class Type { kStarted, kExit, kSignaled, kWatch };
  Type type = Type::kStarted;  ///< "started", "exit", "signaled" or "watch" on the wire
  int pid = 0;                 ///< started
  ExitStatus status;           ///< exit
  int signal = 0;              ///< signaled
  ProcessSample process;       ///< watch (readable: true)
  std::optional<common::ProgressSample> record;  ///< watch, when the worker keeps one
};
/// Parses an event payload; nullopt for anything malformed.
std::optional<AgentEvent> parse_agent_event(std::string_view payload);

}  // namespace dtrain::launcher
