// The agent's worker process: started in its own session and process group, with stdin from
// /dev/null, stdout+stderr on one pipe and a parent-death SIGKILL. It does not read the pipe or
// decide when to signal; agent.cc does. Linux only (prctl, waitid with WNOWAIT).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "launcher/process/exit_status.h"

namespace dtrain::launcher {

struct AgentRequest;

class AgentChild {
 public:
  /// Starts request.argv in request.cwd with request.env and extra_env added to this process's
  /// environment (extra_env wins). Returns once the program has been exec'd (at most 10 s).
  /// Throws as start_process() does: ConfigError when the program or the folder cannot be found
  /// or used (the launcher's spawner words it the same), IoError when the process cannot be
  /// started.
  static std::unique_ptr<AgentChild> spawn(
      const AgentRequest& request,
      const std::vector<std::pair<std::string, std::string>>& extra_env);

  /// SIGKILLs whatever is left of the group and reaps the worker (if it has ended).
  ~AgentChild();
  AgentChild(const AgentChild&) = delete;
  AgentChild& operator=(const AgentChild&) = delete;

  int pid() const { return pid_; }
  /// Read end of the worker's stdout+stderr pipe (close-on-exec), or -1 once closed.
  int output_fd() const { return output_.get(); }
  void close_output() { output_.reset(); }

  /// Sends sig to the worker's process group; a group that is gone is not an error. Safe after
  /// the worker ended: it stays a zombie until this object dies, so its group id is not reused.
  void signal_group(int sig);
  /// Queues sig with value (sigqueue, si_value.sival_int) to the worker process alone, not its
  /// group. Safe after the worker ended, as signal_group is; a failure is not an error.
  void queue_signal(int sig, int value);

  /// The worker's exit status once it has ended (non-blocking; the zombie is not reaped).
  std::optional<ExitStatus> poll_exit();

 private:
  AgentChild(int pid, common::UniqueFd output) : pid_(pid), output_(std::move(output)) {}
  int pid_;
  common::UniqueFd output_;
  std::optional<ExitStatus> status_;
};

}  // namespace dtrain::launcher
