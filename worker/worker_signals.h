// How dtrain-worker takes its signals (docs/design.md#in-place-recovery): SIGTERM (the job's stop,
// or in place a preemption of this worker alone) and SIGUSR1 (the launcher's notice of a new
// generation), both blocked in every thread and taken by one signal thread with sigwaitinfo. It
// only raises flags and interrupts the live group; what a flag means for training is the
// trainer's, and what a notice asks of the group is the recovery client's and the group's.
#pragma once

#include <memory>

#include "worker/comm/group_communicator.h"
#include "worker/signal_origin.h"

namespace spdlog {
class logger;
}

namespace dtrain::train {

/// main()'s first step, before any thread exists: blocks SIGTERM and SIGUSR1 (every later thread
/// inherits the mask) and starts the signal thread, which outlives main(). Until catch_sigterm()
/// a SIGTERM ends the process as its default action would.
void watch_signals();
/// From here on the signal thread logs notices to log (it never reaches spdlog's registry).
void log_signals_to(std::shared_ptr<spdlog::logger> log);
/// From here on SIGTERM does not kill: it asks the group to save and stop at the next step
/// (stop_requested()).
void catch_sigterm();
/// In place: a SIGTERM that is not the job's stop (sent_by_job_stopper) is asked about (asker,
/// on a thread of its own) and, unless the launcher says the job stops, preempts this worker
/// alone (leave_requested()).
void leave_alone_on_sigterm(SigtermAsker asker);
/// main()'s last step: from here the signal thread touches no logger, group or other object that
/// static destruction ends; SIGTERM keeps its meaning (it still ends the process, or sets a flag).
void quiet_signals();

/// True once a SIGTERM asked the group to save and stop. Any thread.
bool stop_requested();
/// True once a SIGTERM preempted this worker alone (in place). Any thread.
bool leave_requested();
/// The pid whose SIGTERM preempted this worker alone.
int leave_sender();
/// The newest generation a notice named (0: none). Any thread.
int noticed_generation();
/// Ends the process by SIGTERM, as the default action would (a worker preempted alone).
void end_by_sigterm();

/// Hands group to the notice for as long as this lives (declare it after the group: it is
/// cleared first); a null group registers nothing (the notice is then ignored).
class NoticeRegistration {
 public:
  explicit NoticeRegistration(comm::GroupCommunicator* group);
  ~NoticeRegistration();
  NoticeRegistration(const NoticeRegistration&) = delete;
  NoticeRegistration& operator=(const NoticeRegistration&) = delete;

 private:
  bool active_;
};

}  // namespace dtrain::train
