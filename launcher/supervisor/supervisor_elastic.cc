// See supervisor.h. Elastic membership (docs/design.md#elastic-membership): a training task whose
// place cannot host it (its host is cut off, its replacement cannot start there) leaves the group
// while at least elastic.min_workers train; the others re-form without it as the next
// generation, holding its virtual shards. Its host is tried again with back-off; when a try
// starts, the host's tasks come back as joiners (spares that can take only their own task's
// place), and once they are warm the group grows back as the next generation. The workers' part
// (which shards each member holds, the sums in virtual-shard order) is theirs.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <set>

#include "common/clock.h"
#include "common/control_protocol.h"
#include "common/json.h"
#include "launcher/plan/worker_env.h"
#include "launcher/process/exit_status.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {

/// How long the joiners of one host wait for each other before the group grows with those ready.
constexpr double kJoinGatherSeconds = 5;
/// Of elastic.host_discovery's output, what is read.
constexpr size_t kMaxDiscoveryBytes = 1 << 20;
/// A command job's host whose probe succeeds this many times in a row while its workers never
/// start there is not tried again.
constexpr int kMostFalseReturns = 3;

}  // namespace

bool Supervisor::elastic() const {
  return plan_.elastic_min_workers > 0;
}

bool Supervisor::member(const Task& task) const {
  return task.plan.trains() && !task.away();
}

std::string Supervisor::members_text() const {
  std::vector<int> members;
  bool all = true;
  for (const auto& task : tasks_) {
    if (!task->plan.trains()) continue;
    if (member(*task))
      members.push_back(*task->plan.rank);
    else
      all = false;
  }
  std::sort(members.begin(), members.end());
  return all ? "" : common::format_members(members);
}

// The chief while it is a member; else the member first in ring order, which has the chief's
// duties in an elastic dtrain-worker group (docs/design.md#elastic-membership).
const Supervisor::Task* Supervisor::acting_chief() const {
  const common::TaskId chief = plan_.context.cluster.chief();
  const Task* first = nullptr;
  for (const auto& task : tasks_) {
    if (!member(*task)) continue;
    if (task->plan.task == chief) return task.get();
    if (!first || *task->plan.rank < *first->plan.rank) first = task.get();
  }
  return first;
}

int Supervisor::world_size() const {
  int n = 0;
  for (const auto& task : tasks_) n += member(*task) ? 1 : 0;
  return n;
}

void Supervisor::record_membership(const char* kind, const std::string& host,
                                   const std::vector<std::string>& names, const std::string& why) {
  int size = world_size();
  membership_.push_back({common::utc_timestamp(), generation_, size});
  recorder_.event(kind, [&](common::JsonWriter& w) {
    w.key("attempt").value(attempt_).key("generation").value(generation_);
    w.key("world_size").value(size).key("host").value(host);
    w.key("tasks").begin_array();
    for (const std::string& name : names) w.value(name);
    w.end_array();
    std::string members = members_text();
    w.key("members").value(members.empty() ? "all" : members);
    if (!why.empty()) w.key("why").value(why);
  });
}

// Why the members on host may not leave, "" when they may (or when none is there): at least
// min_workers stay, and for a command job the chief (MASTER_ADDR, and its program's own rank 0)
// is not among them. A dtrain-worker group hands the chief's duties to its first member.
std::string Supervisor::host_must_stay(const std::string& host) const {
  int leaving = 0;
  const Task* first = nullptr;
  const common::TaskId chief = plan_.context.cluster.chief();
  for (const auto& t : tasks_) {
    if (!member(*t) || !t->plan.runs_on(host)) continue;
    if (!first) first = t.get();
    ++leaving;
    if (t->plan.task == chief && !plan_.in_place)
      return fmt::format("{} on {} is the chief, MASTER_ADDR of the program's group",
                         t->plan.task.text(), t->plan.place_text());
  }
  if (!first) return "";
  const int left = world_size() - leaving;
  if (left < plan_.elastic_min_workers)
    return fmt::format("without {} the group would have {} worker(s), below elastic.min_workers {}",
                       first->plan.place_text(), left, plan_.elastic_min_workers);
  return "";
}

// The members on host, when they may leave (host_must_stay); the reason is logged when not.
bool Supervisor::may_let_go(const std::string& host, std::vector<Task*>& leaving) {
  leaving.clear();
  for (auto& t : tasks_)
    if (member(*t) && t->plan.runs_on(host)) leaving.push_back(t.get());
  if (leaving.empty()) return false;
  const std::string stay = host_must_stay(host);
  if (stay.empty()) return true;
  spdlog::warn("no shrink: {}", stay);
  leaving.clear();
  return false;
}

bool Supervisor::shrink_host(const std::string& host, const std::string& why, const Task* cause) {
  std::vector<Task*> leaving;
  if (!may_let_go(host, leaving)) return false;
  int left = world_size() - static_cast<int>(leaving.size());
  std::string place = leaving.front()->plan.place_text();
  std::vector<std::string> names;
  for (Task* t : leaving) {
    names.push_back(t->plan.task.text());
    const bool running = t->alive() && t->child;
    t->state = running ? Task::State::kLeaving : Task::State::kAway;
    if (running) t->child->signal_group(SIGKILL);  // closes its session too
  }
  ++generation_;
  spdlog::warn("{} is gone ({}): the group shrinks to {} worker(s) as generation {} of attempt {}",
               place, why, left, generation_, attempt_);
  record_membership("shrink", host, names, why);
  double failed_at = in_place_recovery_ ? in_place_recovery_->failed_at : now();
  int64_t reached = in_place_recovery_ ? in_place_recovery_->reached_step : reform_furthest_;
  in_place_recovery_ = PendingInPlace{generation_, failed_at, reached, std::nullopt, std::nullopt};
  notify_members([&](const Task& t) { return &t == cause; });  // the members left
  answer_held_reforms(true, "");
  schedule_rejoin(host, options_.rejoin_first_seconds);
  write_state();
  return true;
}

void Supervisor::schedule_rejoin(const std::string& host, double delay) {
  auto& timer = rejoin_timers_[host];
  if (!timer) timer = clock_->make_timer();
  rejoin_delays_[host] = delay;
  timer->expires_after(delay);
  timer->async_wait([this, host](const boost::system::error_code& ec) {
    if (!ec) guarded("rejoin timer", [&] { try_rejoin(host); });
  });
  auto announced = rejoin_announced_.find(host);
  const bool again = announced != rejoin_announced_.end() && announced->second == delay;
  spdlog::log(again ? spdlog::level::debug : spdlog::level::info,
              "host {}: trying it again in {:g} s", host, delay);
  rejoin_announced_[host] = delay;
}

// Starts every away task of host as a joiner, together: while a session of the host left still
// holds its group (its SIGKILL goes through an agent that may never answer, and the session is
// closed from here seconds later), the try waits as long again. A host still unreachable fails
// the joiners' starts, and the next try waits twice as long (up to rejoin_most_seconds).
void Supervisor::try_rejoin(const std::string& host) {
  if (phase_ != Phase::kRunning || stop_requested_ || given_up_.count(host)) return;
  if (discovered_ && !discovered_->count(host)) {  // not offered yet: ask again later
    schedule_rejoin(host, rejoin_delays_[host]);
    return;
  }
  if (!plan_.context.slurm) return rejoin_unless_leaving(host, "");
  // A drained node still runs the job's new steps: without asking, the host would be joined
  // again at once. The try goes on when Slurm answers.
  if (!rejoin_asking_.insert(host).second) return;  // asked already
  ask_slurm(host, [this, host](const std::string& leaving) {
    rejoin_asking_.erase(host);
    rejoin_unless_leaving(host, leaving);
  });
}

void Supervisor::rejoin_unless_leaving(const std::string& host, const std::string& leaving) {
  if (phase_ != Phase::kRunning || stop_requested_ || given_up_.count(host)) return;
  if (!leaving.empty()) {
    spdlog::info("node {} is still {} in Slurm", host, leaving);
    return schedule_rejoin(host, next_rejoin_delay(host));
  }
  if (!plan_.in_place) return probe_host(host);  // a command job: is the host there at all?
  for (auto& t : tasks_) {
    if (t->away() && !t->joining() && t->plan.where == host && t->holds_group()) {
      spdlog::info("host {}: {}'s last session has not ended yet", host, t->plan.task.text());
      return schedule_rejoin(host, rejoin_delays_[host]);
    }
  }
  bool started = false;
  for (auto& t : tasks_) {
    if (t->state != Task::State::kAway || t->plan.where != host) continue;
    try {
      spawn_task(*t);  // a joiner (kJoining)
      started = true;
    } catch (const std::exception& e) {
      spdlog::warn("{}: cannot start it to join again: {}", t->plan.task.text(), e.what());
    }
  }
  if (!started) return schedule_rejoin(host, next_rejoin_delay(host));
  rejoin_announced_.erase(host);  // its next absence is announced afresh
}

double Supervisor::next_rejoin_delay(const std::string& host) {
  return std::min(options_.rejoin_most_seconds, 2 * rejoin_delays_[host]);
}

void Supervisor::resume_rejoins() {
  std::set<std::string> hosts;
  for (auto& t : tasks_)
    if (t->away()) hosts.insert(t->plan.where);
  for (const std::string& host : hosts) {
    if (given_up_.count(host)) continue;
    auto delay = rejoin_delays_.find(host);  // a host that keeps failing keeps its back-off
    schedule_rejoin(host,
                    delay == rejoin_delays_.end() ? options_.rejoin_first_seconds : delay->second);
  }
  if (!plan_.spec().elastic_discovery.empty()) arm_discovery(0);
}

// elastic.host_discovery (docs/design.md#elastic-membership): its list, every interval.
void Supervisor::arm_discovery(double delay) {
  if (!discovery_timer_) discovery_timer_ = clock_->make_timer();
  discovery_timer_->expires_after(delay);
  discovery_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("host discovery", [this] { run_discovery(); });
  });
}

bool Supervisor::start_side_run(SideRun& run, const SpawnRequest& request, const std::string& what,
                                double limit_seconds, size_t max_output,
                                std::function<void(const ChildEnd&)> done) {
  if (run.running) return false;
  run.child.reset();  // the last one's, released here rather than in its own callback
  run.closed = false;
  run.overflowed = run.abandoned = false;
  run.end.reset();
  run.output.clear();
  SideRun* r = &run;
  auto finish = [this, r, done = std::move(done)] {
    r->running = false;
    if (r->deadline) r->deadline->cancel();
    done(*r->end);
  };
  ChildCallbacks callbacks;
  callbacks.on_output = [r, max_output](std::string_view bytes) {
    if (r->output.size() + bytes.size() > max_output) r->overflowed = max_output > 0;
    if (r->output.size() < max_output)
      r->output.append(bytes.substr(0, max_output - r->output.size()));
  };
  callbacks.on_output_closed = [this, r, finish] {
    guarded("side run output", [&] {
      r->closed = true;
      if (r->end) finish();
    });
  };
  callbacks.on_exit = [this, r, finish](const ChildEnd& end) {
    guarded("side run end", [&] {
      r->end = end;
      if (r->closed) finish();
    });
  };
  try {
    run.child = spawner_.spawn(request, std::move(callbacks));
  } catch (const std::exception& e) {
    spdlog::warn("{} cannot be started: {}", what, e.what());
    return false;
  }
  run.running = true;
  if (limit_seconds <= 0) return true;
  if (!run.deadline) run.deadline = clock_->make_timer();
  run.deadline->expires_after(limit_seconds);
  // Past the limit it is killed and abandoned at once: a helper in another session may hold its
  // output open, and neither its end nor the end of its output must hold up the next run
  // (issue 43). Its process is still reaped; its output is dropped.
  run.deadline->async_wait(
      [this, r, what, limit_seconds, finish](const boost::system::error_code& ec) {
        if (ec || !r->running || !r->child) return;
        guarded("side run deadline", [&] {
          spdlog::warn("{} has run for {:g} s: SIGKILL; its run is abandoned", what, limit_seconds);
          r->child->signal_group(SIGKILL);
          r->child.reset();  // closes the output pipe; no callback of it runs after this
          r->abandoned = true;
          r->end = ChildEnd(ExitStatus::killed(SIGKILL));
          finish();
        });
      });
  return true;
}

void Supervisor::run_discovery() {
  if (phase_ != Phase::kRunning || stop_requested_) return;
  const double interval = plan_.spec().elastic_discovery_seconds;
  arm_discovery(interval);
  SpawnRequest request;
  request.argv = plan_.spec().elastic_discovery;
  request.cwd = plan_.context.cwd;
  // A program that hangs is stopped after max(10 s, two intervals).
  start_side_run(discovery_, request, "elastic.host_discovery", std::max(10.0, 2 * interval),
                 kMaxDiscoveryBytes, [this](const ChildEnd& end) { on_discovery_end(end); });
}

// Lines of host names ("host" or Horovod's "host:slots"); blank lines and # comments skipped.
void Supervisor::on_discovery_end(const ChildEnd& end) {
  if (discovery_.abandoned) return;  // said when it was abandoned
  // A run whose list cannot be trusted: an error event and a log line; the hosts stay as they are.
  auto unused = [&](const std::string& what) {
    spdlog::error("elastic.host_discovery {}; its list is not used this time", what);
    recorder_.event("discovery_error", [&](common::JsonWriter& w) { w.key("what").value(what); });
  };
  if (end.status.signaled || end.status.code != 0)
    return unused(fmt::format("ended {}", describe(end.status)));
  if (discovery_.overflowed)  // a list cut short would let healthy hosts go
    return unused(fmt::format("printed more than {} bytes", kMaxDiscoveryBytes));
  std::set<std::string> hosts;
  size_t at = 0;
  while (at < discovery_.output.size()) {
    size_t eol = discovery_.output.find('\n', at);
    std::string line = discovery_.output.substr(at, eol == std::string::npos ? eol : eol - at);
    at = eol == std::string::npos ? discovery_.output.size() : eol + 1;
    line.erase(0, line.find_first_not_of(" \t\r"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.empty() || line[0] == '#') continue;
    size_t colon = line.rfind(':');
    if (colon != std::string::npos && line.find(':') == colon && colon + 1 < line.size() &&
        line.find_first_not_of("0123456789", colon + 1) == std::string::npos)
      line.resize(colon);  // host:slots
    hosts.insert(line);
  }
  // No host at all is a broken program (a typo, an empty inventory), not every host gone.
  if (hosts.empty()) return unused("listed no host");
  if (discovered_ != hosts) spdlog::info("elastic.host_discovery lists {} host(s)", hosts.size());
  discovered_ = std::move(hosts);
  if (phase_ == Phase::kRunning && !stop_requested_) apply_discovery();
}

// A member host no longer listed leaves (as one that is gone); an away host listed again is
// tried at once.
void Supervisor::apply_discovery() {
  std::set<std::string> member_hosts, away_hosts;
  for (auto& t : tasks_) {
    if (!t->plan.trains() || !t->plan.place_can_leave()) continue;
    (t->away() ? away_hosts : member_hosts).insert(t->plan.where);
  }
  for (const std::string& host : member_hosts) {
    if (discovered_->count(host) || away_hosts.count(host)) continue;
    if (plan_.in_place) {
      shrink_host(host, "not in elastic.host_discovery's list", nullptr);
      continue;
    }
    std::vector<Task*> leaving;  // a command job restarts without the host
    if (!may_let_go(host, leaving)) continue;
    for (auto& t : tasks_)  // its evaluator too (see leave_and_restart)
      if (!t->plan.trains() && t->plan.runs_on(host)) leaving.push_back(t.get());
    std::vector<std::string> names;
    for (Task* t : leaving) {
      t->state = t->alive() ? Task::State::kLeaving : Task::State::kAway;
      names.push_back(t->plan.task.text());
    }
    record_membership("shrink", host, names, "not in elastic.host_discovery's list");
    membership_restart_ = true;
    return begin_teardown(fmt::format(
        "{} is not in elastic.host_discovery's list: the group restarts with {} worker(s)",
        leaving.front()->plan.place_text(), world_size()));
  }
  for (const std::string& host : away_hosts) {
    if (!discovered_->count(host)) {
      given_up_.erase(host);  // listed again later, it is tried again
      continue;
    }
    if (given_up_.count(host)) continue;
    bool trying = (probes_.count(host) && probes_[host].running) || rejoin_asking_.count(host);
    for (auto& t : tasks_) trying = trying || (t->joining() && t->plan.where == host);
    if (!trying) {
      rejoin_delays_[host] = options_.rejoin_first_seconds;
      try_rejoin(host);
    }
  }
}

// An away task's process ended: a joiner whose host is still unreachable, or a member of a host
// that was left (SIGKILLed). Neither fails the job.
void Supervisor::on_away_end(Task& task, const EndReading& reading) {
  const bool was_joining = task.joining();
  task.held_reply = nullptr;
  task.state = Task::State::kAway;
  if (!was_joining || phase_ != Phase::kRunning || stop_requested_) return;
  const std::string& host = task.plan.where;
  // Once per try of the host: its last joiner's end sets the next try.
  for (auto& t : tasks_)
    if (t->joining() && t->plan.where == host) return;
  spdlog::info("host {} does not host {} yet ({})", host, task.plan.task.text(), reading.what);
  schedule_rejoin(host, next_rejoin_delay(host));
}

// A joiner is warm and asks to be let in (its spare request, named after its task). The group
// grows once every joiner of its host has asked, or kJoinGatherSeconds after the first did.
bool Supervisor::on_join_request(const std::string& name, int pid, ReformReplyFn& reply) {
  Task* task = nullptr;
  for (auto& t : tasks_)
    if (t->plan.trains() && t->joining() && t->plan.task.text() == name) task = t.get();
  if (!task) return false;
  if (task->pid != pid && task->pid != 0) {
    spdlog::debug("{}: join request from pid {}, the joiner is {}", name, pid, task->pid);
  }
  task->held_reply = std::move(reply);
  task->state = Task::State::kJoinReady;
  task->made_progress = false;
  const std::string host = task->plan.where;
  bool all_ready = true;
  for (auto& t : tasks_)
    if (t->state == Task::State::kJoining && t->plan.where == host) all_ready = false;
  if (all_ready) {
    grow(host);
  } else {
    auto& timer = rejoin_timers_[host];
    if (!timer) timer = clock_->make_timer();
    timer->expires_after(kJoinGatherSeconds);
    timer->async_wait([this, host](const boost::system::error_code& ec) {
      if (!ec) guarded("join gather", [&] { grow(host); });
    });
  }
  return true;
}

// The ready joiners of host become members as the next generation; the members are told by the
// notice and their reform requests are answered with it.
void Supervisor::grow(const std::string& host) {
  if (phase_ != Phase::kRunning || stop_requested_) return;
  std::vector<Task*> joining;
  for (auto& t : tasks_)
    if (t->state == Task::State::kJoinReady && t->plan.where == host) joining.push_back(t.get());
  if (joining.empty()) return;
  ++generation_;
  std::vector<std::string> names;
  for (Task* t : joining) {
    t->state = Task::State::kRunning;
    t->silent_ends = 0;
    names.push_back(t->plan.task.text());
  }
  spdlog::info("host {} is back: the group grows to {} worker(s) as generation {} of attempt {}",
               host, world_size(), generation_, attempt_);
  record_membership("grow", host, names, "");
  rejoin_delays_[host] = options_.rejoin_first_seconds;
  in_place_recovery_ =
      PendingInPlace{generation_, now(), reform_furthest_, std::nullopt, std::nullopt};
  std::string members = members_text();
  for (Task* t : joining) {
    std::function<void(const std::string&)> reply = std::move(t->held_reply);
    t->held_reply = nullptr;
    append_to_log(*t, common::attempt_header(attempt_, t->plan.task, t->pid,
                                             common::utc_timestamp(), generation_) +
                          " (joins again)\n");
    reply(common::format_spare_assignment({true, t->plan.task.text(), generation_,
                                           task_tf_config(plan_, t->plan, cluster_json_), "",
                                           members}));
  }
  notify_members([&](const Task& t) {  // the members that were there
    return std::find(joining.begin(), joining.end(), &t) != joining.end();
  });
  answer_held_reforms(true, "");
  // A task of host that did not join this time (its joiner failed while another's was warming
  // up) gets a try of its own.
  for (auto& t : tasks_) {
    if (t->away() && !t->joining() && t->plan.where == host) {
      schedule_rejoin(host, options_.rejoin_first_seconds);
      break;
    }
  }
  write_state();
}

// The policy's kLeaveAndRestart: a command job's training task whose host is gone. The group
// restarts at once without that host's tasks, with the members' TF_CONFIG and torchrun variables
// (docs/design.md#elastic-membership). Not a failure: the restart budget is not spent.
void Supervisor::leave_and_restart(Task& task, const EndReading& reading, const std::string& why) {
  std::vector<Task*> leaving;
  if (!may_let_go(task.plan.where, leaving)) return;  // the policy looked: not reached
  // An evaluator there leaves with the host (started there it could only fail, spending the
  // restart budget) and comes back with it.
  for (auto& t : tasks_)
    if (!t->plan.trains() && t->plan.runs_on(task.plan.where)) leaving.push_back(t.get());
  std::vector<std::string> names;
  for (Task* t : leaving) {
    t->state = t->alive() ? Task::State::kLeaving : Task::State::kAway;
    names.push_back(t->plan.task.text());
  }
  record_membership("shrink", task.plan.where, names, why);
  // A host that answers the probe but cannot start its workers would come and go forever.
  if (returning_.count(task.plan.where) && !reading.started &&
      ++false_returns_[task.plan.where] >= kMostFalseReturns) {
    spdlog::warn(
        "host {} answered {} times but its workers did not start there; it is not tried "
        "again (until elastic.host_discovery lists it anew)",
        task.plan.where, kMostFalseReturns);
    given_up_.insert(task.plan.where);
  }
  membership_restart_ = true;
  begin_teardown(fmt::format("{} is gone ({}): the group restarts with {} worker(s)",
                             task.plan.place_text(), why, world_size()));
}

// The next attempt at once, with the members (the membership changed; no failure, no back-off).
void Supervisor::restart_for_membership() {
  membership_restart_ = false;
  recovering_ = true;
  recorder_.event("restart", [&](common::JsonWriter& w) {
    w.key("attempt").value(attempt_ + 1).key("delay_seconds").value(0);
    w.key("after").value("membership").key("restarts").value(book_.restarts());
    w.key("preemptions").value(book_.preemptions()).key("reached_step").value(reached_step_);
  });
  spdlog::info("restarting the group with {} worker(s) (attempt {})", world_size(), attempt_ + 1);
  ++attempt_;
  start_attempt();
}

// `true` on the host through the job's remote shell or srun: exit 0 says it can start workers.
void Supervisor::probe_host(const std::string& host) {
  Task* first = nullptr;
  for (auto& t : tasks_)
    if (t->away() && t->plan.where == host && !first) first = t.get();
  if (!first) return;
  // A remote shell that neither connects nor gives up is given the start time-out; 0 turns it
  // off (docs/job-file.md), as it does for the workers' starts.
  bool started = start_side_run(probes_[host], make_probe_request(plan_, first->plan),
                                "host " + host + "'s probe", plan_.spec().restart.startup_seconds,
                                0, [this, host](const ChildEnd& end) { on_probe_end(host, end); });
  if (!started && !probes_[host].running) schedule_rejoin(host, next_rejoin_delay(host));
}

void Supervisor::on_probe_end(const std::string& host, const ChildEnd& end) {
  if (phase_ != Phase::kRunning || stop_requested_) return;
  if (end.status.signaled || end.status.code != 0) {
    spdlog::info("host {} does not answer yet ({})", host, describe(end.status));
    return schedule_rejoin(host, next_rejoin_delay(host));
  }
  std::vector<std::string> names;
  for (auto& t : tasks_) {
    if (!t->away() || t->plan.where != host) continue;
    t->state = Task::State::kEnded;  // it starts with the next attempt
    names.push_back(t->plan.task.text());
  }
  returning_.insert(host);  // its back-off stays until its workers start there
  record_membership("grow", host, names, "");
  membership_restart_ = true;
  begin_teardown(fmt::format("host {} answers again: the group restarts with {} worker(s)", host,
                             world_size()));
}

}  // namespace dtrain::launcher
