// See worker_signals.h.
#include "worker/worker_signals.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <mutex>
#include <thread>
#include <utility>

#include "common/thread_name.h"

namespace dtrain::train {
namespace {

// SIGTERM (the launcher's teardown, or a preemption) never runs a handler on a working thread:
// the JIT GEMM kernels of Debian's oneDNN 2.x point rsp into the heap while they run, so a signal
// frame pushed on such a thread overwrites heap memory (oneDNN issue #4845, fixed upstream in
// 3.x). SIGTERM stays blocked in every thread (they inherit main's mask, blocked before any thread
// exists) and one thread takes it with sigwait: before catch_sigterm() it ends the process by
// SIGTERM as the default action would; after, it sets the flag the training loop reads each step.
// In place (docs/design.md#in-place-recovery), a SIGTERM that does not come from this worker's
// parent (the launcher, or the agent that relays the launcher's stop) or from the slurmstepd of
// that agent's step (which signals every process of the step) preempts this worker alone: it
// finishes its step and leaves, and a replacement takes its share; from them it is the job's
// stop, which the group agrees on and saves (worker/signal_origin.h).
// SIGUSR1 is blocked and taken by the same thread, for the same reason: the launcher's notice
// (docs/design.md#in-place-recovery), queued with sigqueue and the new generation G as its value,
// interrupts the live group's collective (GroupCommunicator::interrupt(G)) when there is one,
// since a peer cut off by the network closes nothing its peers could see. Any other SIGUSR1 (no
// value, no group: a spare, a run not in place) is ignored and never kills.
// The flags below are globals, not members of an object main() owns: the signal thread that sets
// and reads them starts before anything else exists and outlives main() (see quiet_signals).
std::atomic<bool> g_catching_sigterm{false};
std::atomic<bool> g_leave_alone{false};  ///< set when in place: see above
std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_leave_requested{false};
std::atomic<int> g_leave_sender{0};
// Set before g_leave_alone (and read only once it is): who asks the launcher whether a SIGTERM
// from elsewhere is the whole job's stop (issue 43), and whether a question is under way.
SigtermAsker g_sigterm_asker;
std::atomic<bool> g_asking_launcher{false};
// How long a worker waits for the launcher's answer (which comes within about a second).
constexpr double kSigtermAnswerSeconds = 5;
std::atomic<int> g_noticed_generation{0};  ///< the newest generation a notice named

// What the signal thread does with SIGUSR1 (see above), with what it needs under one lock: the
// live group, set by train() once the group is made and cleared before it is destroyed, and the
// logger, set once logging is set up. The signal thread never reaches spdlog's registry, whose
// default logger main() replaces without synchronising with readers; until then it is silent.
// The signal thread outlives main(): close() (main's last step) leaves it nothing to touch but
// this object, which is never destroyed, so a SIGUSR1 during static destruction, after spdlog's
// registry, sinks and the logger are gone, is taken and ignored (issue 43, item 19).
class NoticeTarget {
 public:
  /// From now on take() ignores every signal, silently. Waits for a take() under way to finish.
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    group_ = nullptr;
    log_.reset();
  }
  void set_group(comm::GroupCommunicator* group) {
    std::lock_guard<std::mutex> lock(mutex_);
    group_ = group;
  }
  void set_log(std::shared_ptr<spdlog::logger> log) {
    std::lock_guard<std::mutex> lock(mutex_);
    log_ = std::move(log);
  }
  void take(const siginfo_t& info) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    if (info.si_code != SI_QUEUE) {
      if (log_) log_->info("SIGUSR1 from pid {} without a generation: ignored", info.si_pid);
      return;
    }
    const int generation = info.si_value.sival_int;
    if (log_) log_->info("notice: the launcher re-forms the group as generation {}", generation);
    // A rendezvous under way for an older generation gives up (CommOptions::superseded).
    for (int seen = g_noticed_generation.load();
         generation > seen && !g_noticed_generation.compare_exchange_weak(seen, generation);) {
    }
    if (group_ && group_->interrupt(generation)) return;  // the trainer logs the break
    if (log_) {
      log_->info(
          "notice for generation {} ignored: {}", generation,
          group_ ? "this worker is not in an older generation's group" : "no group here to leave");
    }
  }

 private:
  std::mutex mutex_;
  bool closed_ = false;
  comm::GroupCommunicator* group_ = nullptr;
  std::shared_ptr<spdlog::logger> log_;
};
NoticeTarget& g_notice = *new NoticeTarget;  // never destroyed: the signal thread outlives main()

// A SIGTERM from elsewhere, in place: the launcher says whether the whole job is stopping (then
// the group saves and stops together) or this worker alone is preempted. Asked on a thread of its
// own, so notices keep coming; a SIGTERM while a question is under way joins it.
void ask_about_sigterm(int sender) {
  if (g_asking_launcher.exchange(true)) return;
  std::thread([asker = g_sigterm_asker, sender] {
    common::name_this_thread("dt-sigterm");
    if (launcher_says_job_stop(asker, sender, kSigtermAnswerSeconds) || g_stop_requested) {
      g_stop_requested = true;
    } else {
      g_leave_sender = sender;
      g_leave_requested = true;
    }
    g_asking_launcher = false;
  }).detach();
}

}  // namespace

void end_by_sigterm() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  ::signal(SIGTERM, SIG_DFL);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(SIGTERM);  // the default action: the whole process ends, by SIGTERM
}

void watch_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    common::name_this_thread("dt-signals");
    while (true) {
      siginfo_t info{};
      int taken = ::sigwaitinfo(&set, &info);
      if (taken == SIGUSR1) g_notice.take(info);
      if (taken != SIGTERM) continue;
      if (!g_catching_sigterm) end_by_sigterm();
      bool job_stop = info.si_code == SI_USER && sent_by_job_stopper(info.si_pid);
      if (g_leave_alone && !job_stop) {
        ask_about_sigterm(info.si_pid);
      } else {
        g_stop_requested = true;
      }
    }
  }).detach();
}

// main()'s last step: from here the signal thread touches no logger, group or other object that
// static destruction ends; SIGTERM keeps its meaning (it still ends the process, or sets a flag).
void quiet_signals() {
  g_leave_alone = false;  // a late SIGTERM sets a flag; it no longer reads g_sigterm_asker
  g_notice.close();
}

// From here on SIGTERM does not kill: it asks the group to save and stop at the next step.
void catch_sigterm() {
  g_catching_sigterm = true;
}

void log_signals_to(std::shared_ptr<spdlog::logger> log) {
  g_notice.set_log(std::move(log));
}

void leave_alone_on_sigterm(SigtermAsker asker) {
  g_sigterm_asker = std::move(asker);
  g_leave_alone = true;
}

bool stop_requested() {
  return g_stop_requested.load();
}

bool leave_requested() {
  return g_leave_requested.load();
}

int leave_sender() {
  return g_leave_sender.load();
}

int noticed_generation() {
  return g_noticed_generation.load();
}

NoticeRegistration::NoticeRegistration(comm::GroupCommunicator* group) : active_(group != nullptr) {
  if (active_) g_notice.set_group(group);
}

NoticeRegistration::~NoticeRegistration() {
  if (active_) g_notice.set_group(nullptr);
}

}  // namespace dtrain::train
