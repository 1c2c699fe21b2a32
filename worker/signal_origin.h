// Who a signal came from, as dtrain-worker's SIGTERM rule needs it
// (docs/design.md#in-place-recovery): a SIGTERM from one of the worker's ancestors (the launcher,
// the agent that relays the launcher's stop, the slurmstepd that runs that agent's step) is the
// job's stop, which the group agrees on and saves; one from anyone else preempts this worker
// alone. Under Slurm a step's signal reaches every process of the step, the worker as well as
// its agent, from slurmstepd: counting only the parent would take the job's stop for a
// preemption of each worker in turn.
#pragma once

namespace dtrain::train {

/// True when sender is an ancestor of this process (its parent, the parent's parent, ...),
/// init (pid 1) excepted: a host going down signals everything from pid 1, and that preempts
/// this worker alone. Reads /proc; false where it cannot tell.
bool sent_by_ancestor(int sender);

}  // namespace dtrain::train
