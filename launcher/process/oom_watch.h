// Whether the kernel's OOM killer ended a worker: the memory cgroup's oom_kill counter (cgroup v2
// memory.events, v1 memory.oom_control), read at spawn and again at a SIGKILL death. It reads
// counters only; it sets no limits and cannot tell which process of the cgroup was killed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "launcher/process/exit_status.h"

namespace dtrain::launcher {

class OomWatch {
 public:
  /// The memory cgroup this process (and so each local worker it starts) is in, from
  /// /proc/self/cgroup and /proc/self/mountinfo; a watch that sees nothing where there is none.
  static OomWatch for_this_process();
  /// The same from given texts of those two files (for tests).
  static OomWatch from_proc_files(std::string_view proc_cgroup, std::string_view mountinfo);
  /// A cgroup folder: its memory.events (v2) if there is one, else its memory.oom_control (v1).
  static OomWatch for_cgroup(const std::string& dir);

  /// The cgroup's oom_kill counter now; nullopt when there is no readable counter (no memory
  /// cgroup, a v1 kernel older than 4.13). Reads one small sysfs file; never blocks for long.
  /// On v2 the counter includes the cgroups below; on v1 it counts this cgroup's own kills only.
  std::optional<uint64_t> kills() const;
  /// The file read, e.g. /sys/fs/cgroup/user.slice/memory.events; "" when none.
  const std::string& counter_file() const { return counter_file_; }
  /// "memory.events oom_kill" or "memory.oom_control oom_kill", for messages.
  std::string counter_name() const;

  /// For a worker that ended with status and whose spawn saw kills_at_spawn: the text of
  /// oom_kill_cause() with the counter read now, or nullopt.
  std::optional<std::string> explain(const ExitStatus& status,
                                     std::optional<uint64_t> kills_at_spawn) const;

 private:
  explicit OomWatch(std::string counter_file) : counter_file_(std::move(counter_file)) {}
  std::string counter_file_;
};

/// "killed by the kernel's OOM killer (memory.events oom_kill rose)" when status is a death by
/// SIGKILL (killed_by_sigkill()) and the counter rose from before to after; else nullopt.
std::optional<std::string> oom_kill_cause(const ExitStatus& status, std::optional<uint64_t> before,
                                          std::optional<uint64_t> after,
                                          std::string_view counter = "memory.events oom_kill");

}  // namespace dtrain::launcher
