// A small process forked from the launcher that outlives it by a moment: when the launcher dies,
// even by SIGKILL, the guardian sees its pipe close and ends every worker process group it was
// told about (SIGTERM, then SIGKILL after a second). Parent-death signals alone would miss the
// grandchildren a worker forks.
#pragma once

#include <sys/types.h>

#include "common/unique_fd.h"

namespace dtrain::launcher {

class GroupGuardian {
 public:
  /// Forks the guardian. Call while the launcher has one thread. Throws IoError.
  static GroupGuardian start();

  GroupGuardian(GroupGuardian&&) = default;
  GroupGuardian& operator=(GroupGuardian&&) = default;
  /// Closes the pipe: the guardian ends the groups still listed, then exits. Does not wait.
  ~GroupGuardian() = default;

  /// Adds a process group to end if the launcher dies. Never blocks for long (a pipe write).
  void watch(pid_t pgid);
  /// Removes a group that ended normally.
  void forget(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  GroupGuardian(common::UniqueFd pipe, pid_t pid) : pipe_(std::move(pipe)), pid_(pid) {}
  void send(char op, pid_t pgid);

  common::UniqueFd pipe_;
  pid_t pid_ = -1;
};

}  // namespace dtrain::launcher
