// See freeze_watch.h.
#include "launcher/freeze_watch.h"

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
  s.readable = true;
  return s;
}

std::optional<FreezeVerdict> FreezeWatch::stopped_or_silent(
    double now, const std::vector<MemberObservation>& members) {
  const size_t n = members.size();
  if (stopped_since_.size() != n) stopped_since_.assign(n, -1);
  const double limit = std::max(min_seconds_, bound_);
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
  v.stalled_seconds = members[quietest].silent_seconds;
  v.bound_seconds = kSilentSeconds;
  v.why = fmt::format("no word from it for {:.1f} s (its host is cut off or gone)",
                      members[quietest].silent_seconds);
  return v;
}

FreezeWatch::FreezeWatch(double min_seconds, double step_multiple)
    : min_seconds_(min_seconds), step_multiple_(step_multiple) {}

void FreezeWatch::reset() {
  last_advance_ = -1;
  last_.clear();
  cpu_at_advance_.clear();
  ended_since_reset_.clear();
}

std::optional<FreezeVerdict> FreezeWatch::observe(double now,
                                                  const std::vector<MemberObservation>& members) {
  const size_t n = members.size();
  if (last_.size() != n) {
    reset();
    last_.resize(n);
    cpu_at_advance_.resize(n, 0);
    ended_since_reset_.assign(n, false);
  }
  // Whatever the records say (a group forming again, a member still loading): a process stopped
  // for longer than the bound, or a remote member whose agent went quiet while another member is
  // heard from, is what the group waits for.
  if (std::optional<FreezeVerdict> v = stopped_or_silent(now, members)) {
    reset();
    return v;
  }
  bool advanced = last_advance_ < 0;
  std::vector<double> step_times;
  for (size_t i = 0; i < n; ++i) {
    const std::optional<common::ProgressSample>& r = members[i].record;
    if (!r || r->global_step == 0) return std::nullopt;  // not training yet: nothing to judge
    if (!same(*r, last_[i])) advanced = true;
    if (r->ended > last_[i].ended && last_[i].pid == r->pid) ended_since_reset_[i] = true;
    if (r->step_seconds > 0) step_times.push_back(r->step_seconds);
  }
  bound_ = std::max(min_seconds_, step_multiple_ * median(step_times));
  if (advanced) {
    last_advance_ = now;
    for (size_t i = 0; i < n; ++i) {
      last_[i] = *members[i].record;
      cpu_at_advance_[i] = members[i].process.cpu_ticks;
    }
    return std::nullopt;
  }
  double stalled = now - last_advance_;
  if (stalled <= bound_) return std::nullopt;
  FreezeVerdict v;
  v.stalled_seconds = stalled;
  v.bound_seconds = bound_;
  if (!std::all_of(ended_since_reset_.begin(), ended_since_reset_.end(), [](bool b) { return b; }))
    return std::nullopt;  // a group still forming after a reset is not frozen
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
    const MemberObservation& m = members[laggard];
    bool busy = m.process.cpu_ticks > cpu_at_advance_[laggard];
    v.member = laggard;
    v.why = busy ? fmt::format(
                       "busy outside the collectives for {:.1f} s while the others wait "
                       "in collective {}",
                       stalled, most)
                 : fmt::format(
                       "no CPU time for {:.1f} s outside any collective while the others "
                       "wait in collective {} (deadlocked or blocked)",
                       stalled, most);
    return v;
  }
  bool all_inside = std::all_of(members.begin(), members.end(), [](const MemberObservation& m) {
    return m.record->in_collective();
  });
  if (!all_inside) return std::nullopt;  // nobody waits for anybody: not a member's freeze
  v.why = fmt::format("every member has waited {:.1f} s inside collective {}: a link is down",
                      stalled, most);
  return v;
}

}  // namespace dtrain::launcher
