// Remote tasks behind the child seam (docs/design.md#child-seam): a spawner that wraps the
// local one and turns every request for `dtrain agent` (over the remote shell, or as a Slurm job
// step) into a child that speaks the agent protocol. It reads the agent's marker lines, keeps the
// session alive, times out a start the agent never reports, and tells how the worker ended (its
// real status, or "host lost" with the remote shell's own words) through the same callbacks as a
// local child. The supervisor never sees marker lines, ssh's exit codes or Slurm.
#pragma once

#include <memory>

#include "launcher/placement/process_spawner.h"
#include "launcher/process/loop_clock.h"

namespace boost::asio {
class io_context;
}

namespace dtrain::launcher {

/// Requests without `remote` go to local unchanged. local (and clock, when given) is not owned
/// and must outlive the result; everything runs on io's thread. clock: the loop's time
/// (docs/design.md#time-on-the-loop); null, the steady clock.
std::unique_ptr<ProcessSpawner> make_agent_spawner(boost::asio::io_context& io,
                                                   ProcessSpawner& local,
                                                   LoopClock* clock = nullptr);

}  // namespace dtrain::launcher
