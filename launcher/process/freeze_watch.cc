// See freeze_watch.h.
#include "launcher/process/freeze_watch.h"

#include <dirent.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace dtrain::launcher {

namespace {

bool same(const common::ProgressSample& a, const common::ProgressSample& b) {
  return a.pid == b.pid && a.generation == b.generation && a.begun == b.begun &&
         a.ended == b.ended && a.global_step == b.global_step;
}

bool stopped(char state) {
  return state == 'T' || state == 't';
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

uint64_t grown(uint64_t before, uint64_t after) {
  return after > before ? after - before : 0;  // a thread that ended takes its sums with it
}

// The share of dt a member could have used for its own work: none while it says it is busy
// (saving, validating) or waits in uninterruptible I/O, and of the rest the part its threads
// spent on a CPU rather than waiting for one. A process that neither ran nor waited to run
// (blocked, deadlocked) could have used all of it; one that is runnable (R) and did not run has
// waited the whole time for a CPU (or a CPU quota), a wait the kernel adds to its counters only
// once the thread runs again.
double usable_share(double dt, const ProcessSample& before, const MemberObservation& m) {
  if (m.record && m.record->busy()) return 0;
  if (m.process.state == 'D') return 0;
  if (!before.readable || !m.process.readable) return dt;
  const double run = static_cast<double>(grown(before.run_ns, m.process.run_ns));
  const double wait = static_cast<double>(grown(before.wait_ns, m.process.wait_ns));
  if (run + wait > 0) return dt * run / (run + wait);
  // No schedstat movement: no thread was scheduled in the interval, or the kernel keeps no
  // schedstat (both counters stay 0). Every thread sleeping or blocked, it could have used all
  // of it; with a thread runnable (the main thread may sleep waiting for it), it ran only if its
  // CPU time grew, and otherwise waited for a CPU or its quota.
  if (!m.process.runnable) return dt;
  return m.process.cpu_ticks > before.cpu_ticks ? dt : 0;
}

// The state letter in a /proc stat line ("pid (comm) state ..."; comm may hold spaces and
// parentheses: the letter follows the last ')'), or '?'.
char state_letter(const std::string& text) {
  size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return '?';
  return text[close + 2];
}

// Adds each thread's time on a CPU and waiting for one (/proc/<pid>/task/<tid>/schedstat: "run
// wait slices", nanoseconds), and notes whether any thread is runnable.
void read_threads(int pid, ProcessSample& s) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* dir = ::opendir(tasks.c_str());
  if (!dir) return;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(tasks + "/" + e->d_name + "/schedstat");
    uint64_t run = 0, wait = 0;
    if (in >> run >> wait) {
      s.run_ns += run;
      s.wait_ns += wait;
    }
    std::ifstream stat(tasks + "/" + e->d_name + "/stat");
    std::string text;
    if (std::getline(stat, text) && state_letter(text) == 'R') s.runnable = true;
  }
  ::closedir(dir);
}

}  // namespace

ProcessSample read_process(int pid) {
  ProcessSample s;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return s;
  // "pid (comm) state ppid ..."; comm may hold spaces and parentheses: take the last ')'.
  size_t close = text.rfind(')');
  if (close == std::string::npos) return s;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  std::vector<std::string> f;
  while (fields >> field) f.push_back(field);
  if (f.size() < 13) return s;  // state is f[0]; utime, stime are fields 14 and 15 of stat
  s.state = f[0].empty() ? '?' : f[0][0];
  try {
    s.cpu_ticks = std::stoull(f[11]) + std::stoull(f[12]);
  } catch (const std::exception&) {
    return s;
  }
  read_threads(pid, s);
  s.runnable = s.runnable || s.state == 'R';
  s.readable = true;
  return s;
}

FreezeWatch::FreezeWatch(FreezeSettings settings) : settings_(settings) {}

void FreezeWatch::reset(bool fresh) {
  last_advance_ = -1;
  last_.clear();
  cpu_at_advance_.clear();
  usable_.clear();
  ended_since_reset_.clear();
  at_reset_.clear();
  at_reset_taken_ = fresh;  // fresh: no old record to move past (at_reset_ stays empty)
}

void FreezeWatch::count_usable(double now, const std::vector<MemberObservation>& members) {
  const size_t n = members.size();
  const double dt = last_look_ >= 0 ? std::max(0.0, now - last_look_) : 0;
  last_look_ = now;
  const bool known = process_seen_.size() == n;
  process_seen_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (known) usable_[i] += usable_share(dt, process_seen_[i], members[i]);
    process_seen_[i] = members[i].process;
  }
}

std::optional<FreezeVerdict> FreezeWatch::warn_or_confirm(FreezeVerdict v) {
  v.confirmed = v.stalled_seconds > kConfirmFactor * v.bound_seconds;
  if (v.confirmed) {
    reset();
    warned_ = false;
    return v;
  }
  if (warned_) return std::nullopt;
  warned_ = true;
  return v;
}

std::optional<FreezeVerdict> FreezeWatch::stopped_or_silent(
    double now, const std::vector<MemberObservation>& members) {
  const size_t n = members.size();
  if (stopped_since_.size() != n) stopped_since_.assign(n, -1);
  const double limit = std::max(settings_.floor_seconds, bound_);
  size_t longest = n;
  for (size_t i = 0; i < n; ++i) {
    if (!stopped(members[i].process.state)) {
      stopped_since_[i] = -1;
      continue;
    }
    if (stopped_since_[i] < 0) stopped_since_[i] = now;
    if (now - stopped_since_[i] > limit &&
        (longest == n || stopped_since_[i] < stopped_since_[longest]))
      longest = i;
  }
  FreezeVerdict v;
  v.bound_seconds = limit;
  if (longest < n) {
    v.member = longest;
    v.cause = FreezeCause::kStopped;
    v.stalled_seconds = now - stopped_since_[longest];
    v.why = fmt::format("stopped (process state {}: SIGSTOP or a debugger)",
                        members[longest].process.state);
    return v;
  }
  // A quiet agent whose group still moves is a slow path to this launcher, not a cut host.
  bool changed = seen_.size() != n;
  seen_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::optional<common::ProgressSample>& r = members[i].record;
    if (r.has_value() != seen_[i].has_value() || (r && !same(*r, *seen_[i]))) changed = true;
    seen_[i] = r;
  }
  if (changed || changed_at_ < 0) changed_at_ = now;
  if (now - changed_at_ <= limit) return std::nullopt;
  size_t quietest = n;
  bool someone_heard = false;
  for (size_t i = 0; i < n; ++i) {
    const double silent = members[i].silent_seconds;
    if (silent <= kSilentSeconds) someone_heard = true;
    if (silent > kSilentSeconds && (quietest == n || silent > members[quietest].silent_seconds))
      quietest = i;
  }
  // Every member quiet at once is this launcher not reading, not their hosts.
  if (quietest == n || !someone_heard) return std::nullopt;
  v.member = quietest;
  v.cause = FreezeCause::kSilent;
  v.stalled_seconds = now - changed_at_;
  v.why = fmt::format("no word from it for {:.1f} s (its host is cut off or gone)",
                      members[quietest].silent_seconds);
  return v;
}

std::optional<FreezeVerdict> FreezeWatch::observe(double now,
                                                  const std::vector<MemberObservation>& members) {
  const size_t n = members.size();
  if (last_.size() != n) {
    if (!last_.empty()) reset();  // other members without a reset: judge them afresh
    last_.resize(n);
    cpu_at_advance_.resize(n, 0);
    usable_.assign(n, 0);
    ended_since_reset_.assign(n, false);
  }
  count_usable(now, members);
  if (!at_reset_taken_) {
    at_reset_.assign(n, std::nullopt);
    for (size_t i = 0; i < n; ++i)
      if (members[i].record)
        at_reset_[i] = std::pair{members[i].record->pid, members[i].record->ended};
    at_reset_taken_ = true;
  }
  // Whatever the records say (a group forming again, a member still loading): a process stopped
  // for longer than the bound, or a remote member whose agent went quiet while another member is
  // heard from, is what the group waits for.
  std::optional<FreezeVerdict> v = stopped_or_silent(now, members);
  if (!v) v = stalled(now, members);
  if (!v) {
    warned_ = false;  // the stall, if there was one, is over
    return std::nullopt;
  }
  return warn_or_confirm(std::move(*v));
}

std::optional<FreezeVerdict> FreezeWatch::stalled(double now,
                                                  const std::vector<MemberObservation>& members) {
  const size_t n = members.size();
  bool advanced = last_advance_ < 0;
  std::vector<double> step_times;
  for (size_t i = 0; i < n; ++i) {
    const std::optional<common::ProgressSample>& r = members[i].record;
    if (!r || r->global_step == 0) return std::nullopt;  // not training yet: nothing to judge
    if (!same(*r, last_[i])) advanced = true;
    const std::optional<std::pair<int, uint64_t>> before =
        i < at_reset_.size() ? at_reset_[i] : std::nullopt;
    if (before && before->first == r->pid ? r->ended > before->second : r->ended > 0)
      ended_since_reset_[i] = true;
    if (r->step_seconds > 0) step_times.push_back(r->step_seconds);
  }
  bound_ = std::max(settings_.floor_seconds, settings_.step_multiple * median(step_times));
  if (advanced) {
    last_advance_ = now;
    for (size_t i = 0; i < n; ++i) {
      last_[i] = *members[i].record;
      cpu_at_advance_[i] = members[i].process.cpu_ticks;
      usable_[i] = 0;
    }
    return std::nullopt;
  }
  const double wall = now - last_advance_;
  if (wall <= bound_) return std::nullopt;
  if (!std::all_of(ended_since_reset_.begin(), ended_since_reset_.end(), [](bool b) { return b; }))
    return std::nullopt;  // a group still forming after a reset is not frozen
  FreezeVerdict v;
  v.bound_seconds = bound_;
  // The others wait inside the collective the laggard has not begun.
  uint64_t most = 0;
  for (const MemberObservation& m : members) most = std::max(most, m.record->begun);
  size_t laggard = n;
  for (size_t i = 0; i < n; ++i) {
    if (members[i].record->begun < most &&
        (laggard == n || members[i].record->begun < members[laggard].record->begun)) {
      laggard = i;
    }
  }
  if (laggard < n) {
    // Judged on the time it could have used: short of CPU, in I/O or busy it is not frozen.
    v.stalled_seconds = usable_[laggard];
    if (v.stalled_seconds <= bound_) return std::nullopt;
    const MemberObservation& m = members[laggard];
    bool busy = m.process.cpu_ticks > cpu_at_advance_[laggard];
    v.member = laggard;
    v.cause = busy ? FreezeCause::kBusy : FreezeCause::kBlocked;
    v.why = busy ? fmt::format(
                       "busy outside the collectives for {:.1f} s of its own ({:.1f} s wall) "
                       "while the others wait in collective {}",
                       v.stalled_seconds, wall, most)
                 : fmt::format(
                       "no CPU time for {:.1f} s outside any collective while the others "
                       "wait in collective {} (deadlocked or blocked)",
                       wall, most);
    return v;
  }
  bool all_inside = std::all_of(members.begin(), members.end(), [](const MemberObservation& m) {
    return m.record->in_collective();
  });
  if (!all_inside) return std::nullopt;  // nobody waits for anybody: not a member's freeze
  // A collective stuck because a member inside it is short of CPU (a quota, a busy machine) or
  // in I/O is slow, not cut: count only the time every member could have used.
  v.stalled_seconds = *std::min_element(usable_.begin(), usable_.end());
  if (v.stalled_seconds <= bound_) return std::nullopt;
  v.cause = FreezeCause::kLinkDown;
  v.why = fmt::format("every member has waited {:.1f} s inside collective {}: a link is down", wall,
                      most);
  return v;
}

}  // namespace dtrain::launcher
