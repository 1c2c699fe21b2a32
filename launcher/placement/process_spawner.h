// The seam between the supervisor and the OS: start a worker process and hear about its output
// and its end. The real spawner (start_process() on an Asio loop) is in local_spawner.cc; unit
// tests use a fake. Everything is called and calls back on the io_context's one thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launcher/process/exit_status.h"
#include "launcher/process/freeze_watch.h"

namespace boost::asio {
class io_context;
}

namespace dtrain::launcher {

/// Where a request for `dtrain agent` runs; the agent spawner (launcher/placement/remote_child.h)
/// reads it.
struct RemoteTarget {
  enum class Kind { kRemoteShell, kSlurmStep };
  Kind kind = Kind::kRemoteShell;
  std::string name;             ///< the host or the Slurm node
  double start_seconds = 30.0;  ///< the agent must report the worker started by then (0: no limit)
};

struct SpawnRequest {
  std::vector<std::string> argv;  ///< argv[0]: a path, or a name looked up on PATH
  std::vector<std::pair<std::string, std::string>> env;  ///< set on top of the launcher's own
  std::string cwd;                                       ///< "" = the launcher's
  std::string agent_request;  ///< format_agent_request(): argv, env and cwd, never on argv
  /// Set when argv reaches a `dtrain agent` (over the remote shell, or as a Slurm step): stdin
  /// becomes a pipe that gets agent_request first and stays open (closing it ends the remote
  /// group), and signal_group() sends the signal as an agent command instead of signalling the
  /// local process group. The agent spawner (remote_child.h) speaks the rest of the protocol.
  std::optional<RemoteTarget> remote;

  bool agent() const { return remote.has_value(); }
};

/// How a child ended.
struct ChildEnd {
  enum class Cause {
    kExited,      ///< the worker ended with status
    kNotStarted,  ///< a remote worker was never started (its agent did not report it in time)
    kPlaceLost,   ///< the host or node was lost before the worker's end was reported
  };
  ChildEnd(ExitStatus s, Cause c = Cause::kExited, std::string d = {})  // NOLINT: implicit
      : status(s), cause(c), detail(std::move(d)) {}
  /// The worker's own status: for a remote worker, what its agent reported when it could;
  /// else the remote shell's or srun's.
  ExitStatus status;
  Cause cause;
  std::string detail;  ///< kNotStarted, kPlaceLost: what happened, with ssh's or srun's own words
  /// What the end means, read where the process ran, or "": a SIGKILL while the memory cgroup
  /// of this machine counted an OOM kill since the spawn (a local child's: OomWatch::explain).
  std::string explanation;
};

struct ChildCallbacks {
  std::function<void(std::string_view bytes)> on_output;  ///< stdout and stderr, in write order
  std::function<void()> on_output_closed;                 ///< end of output (whole group closed it)
  std::function<void(const ChildEnd& end)> on_exit;       ///< the process itself ended
  /// A remote worker runs now (pid on its host). Local children run from spawn() on; never called.
  std::function<void(int remote_pid)> on_started;
  /// A control message a remote worker sent through its agent (heartbeat, progress).
  std::function<void(const std::string& line)> on_control;
  /// Someone other than the launcher signalled the remote task. place_ending: its place is going
  /// away (Slurm ending the job's steps), so the launch should stop and be requeued.
  std::function<void(int sig, bool place_ending)> on_signaled;
  /// A request a remote worker sent through its agent that waits for its answer ({"request":
  /// "reform"} or "spare", common/control_protocol.h): json is its line; reply(line) answers it
  /// on the worker's connection (at most once; a reply after the child is gone goes nowhere).
  std::function<void(const std::string& json, std::function<void(const std::string& line)> reply)>
      on_request;
};

/// A started process. It leads its own process group; its children are in that group too.
class Child {
 public:
  virtual ~Child() = default;
  virtual int pid() const = 0;
  /// Sends sig to the whole process group. A group that is already gone is not an error.
  virtual void signal_group(int sig) = 0;
  /// Queues sig with value (sigqueue) to the worker process alone, wherever it runs: the
  /// launcher's notice that its group re-forms (docs/design.md#in-place-recovery). A process
  /// that is gone is not an error.
  virtual void queue_signal(int sig, int value);
  /// What the launcher sees of the worker without its help (docs/design.md#frozen-workers): its
  /// process's state and CPU time and, when progress_path names its record, the record (only
  /// when written by this process). A remote child answers with what its agent last reported,
  /// and how long ago (silent_seconds).
  virtual MemberObservation look(const std::string& progress_path) const;
  /// True when its process counts as running only once it reports so (on_started): a remote
  /// session's first output is ssh's or srun's, no sign of the worker. A local one runs from
  /// spawn() on.
  virtual bool reports_start() const { return false; }
  /// The pid the worker knows itself by (its progress record, its requests): a local child's
  /// own; a remote one's on its host, once its agent reported it (0 before).
  virtual int worker_pid() const { return pid(); }
  /// Why a process that connected to the launcher's control socket as peer_pid does not speak
  /// for this child, named who ("worker:1"), or "" when it does: a local child's own process or
  /// one in its process group speaks for it; a remote child speaks only through its agent.
  virtual std::string sender_refusal(int peer_pid, const std::string& who) const;
  /// Why its process outlives a SIGKILL, as far as can be seen from here: a frozen cgroup or an
  /// uninterruptible sleep of a local one (from /proc and the cgroup freezer); a remote session
  /// that did not end.
  virtual std::string why_unkillable() const;
  /// Writes text to the stdin of a `dtrain agent` session (SpawnRequest::remote); a child of any
  /// other request ignores it.
  virtual void write_agent(const std::string& text) { (void)text; }
};

class ProcessSpawner {
 public:
  virtual ~ProcessSpawner() = default;
  /// Starts argv in a new process group with stdin from /dev/null and stdout+stderr on one pipe;
  /// it is SIGKILLed if the launcher dies. Throws as start_process() does: ConfigError when the
  /// program cannot be found or run or cwd cannot be entered, IoError when it cannot be started
  /// (no descriptors left, ...); never returns a Child without a process. Blocks until exec (at
  /// most 10 s). No callback runs after the Child is destroyed, and none inside spawn().
  virtual std::unique_ptr<Child> spawn(const SpawnRequest& request, ChildCallbacks callbacks) = 0;
};

/// The real spawner, on io.
std::unique_ptr<ProcessSpawner> make_local_spawner(boost::asio::io_context& io);

}  // namespace dtrain::launcher
