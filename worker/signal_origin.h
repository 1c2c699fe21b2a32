// Who a SIGTERM came from, as dtrain-worker's rule needs it (docs/design.md#in-place-recovery):
// from the worker's parent (the launcher, or the agent that relays the launcher's stop) or from
// the Slurm step daemon above it, the SIGTERM is the job's stop, which the group agrees on and
// saves; from anyone else it preempts this worker alone. Under Slurm a step's signal reaches
// every process of the step, the worker as well as its agent, from slurmstepd: counting only the
// parent would take the job's stop for a preemption of each worker in turn. Other ancestors do
// not count: the shell that started `dtrain launch` may well be the one that preempts a worker.
#pragma once

#include <string>

namespace dtrain::train {

/// True when sender is this process's parent, or an ancestor of it named "slurmstepd". Reads
/// /proc; false where it cannot tell.
bool sent_by_job_stopper(int sender);

/// Who asks the launcher about a SIGTERM from elsewhere: DTRAIN_CONTROL's address, the task and
/// its attempt.
struct SigtermAsker {
  std::string control_address;
  std::string task;
  int attempt = 0;
};

/// Whether a SIGTERM that sender (not the parent) sent this worker is part of the whole job's
/// stop, which signals the launcher and every worker together (systemctl stop, a kill of the
/// process tree): asks the launcher (common::SigtermQuery) and blocks up to timeout_seconds.
/// False (a preemption of this worker alone) when the launcher says so, cannot be reached or
/// does not answer in time.
bool launcher_says_job_stop(const SigtermAsker& asker, int sender, double timeout_seconds);

}  // namespace dtrain::train
