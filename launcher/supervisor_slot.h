// The supervisor's record of one task: its process, log file and what it last reported.
// Private to supervisor*.cc.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/cluster_spec.h"
#include "common/control_protocol.h"
#include "common/unique_fd.h"
#include "launcher/exit_status.h"
#include "launcher/line_splitter.h"
#include "launcher/process_spawner.h"
#include "launcher/supervisor.h"

namespace dtrain::launcher {

struct Supervisor::Slot {
  common::TaskId task;
  std::string address;
  std::string log_path;
  bool trains = false;
  /// Where `dtrain agent` runs the worker, "host 10.0.0.7" (over the remote shell) or "node n1"
  /// (a Slurm step); "" for a local worker. Agent output carries marker lines.
  std::string agent_place;
  bool agent_reported_exit = false;  ///< the agent said how the remote worker ended
  bool agent_started = false;        ///< the agent said the worker runs (its "started" event)
  std::unique_ptr<Child> child;
  int pid = 0;
  bool exited = true;
  bool output_open = false;
  std::optional<ExitStatus> status;
  double last_progress = 0;
  std::optional<common::ControlMessage> progress;
  common::UniqueFd log;
  std::string pending;  // complete lines of the current chunk, written to the log in one go
  std::deque<std::string> last_lines;  // of this attempt, for the failure summary
  std::unique_ptr<LineSplitter> splitter;

  /// Keeps line (its terminator dropped) among the last 20 of this attempt.
  void remember(std::string_view line) {
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
    last_lines.emplace_back(line);
    if (last_lines.size() > 20) last_lines.pop_front();
  }
};

}  // namespace dtrain::launcher
