// Elastic membership (docs/design.md#elastic-membership) on two network-namespace hosts with two
// workers each (test/support/netns_hosts.h), the main job's model and data, run by
// scripts/bench-elastic.sh as root. First the step time at full membership without and with
// "elastic" (undisturbed runs, alternated); then runs where the second host's link is cut at a
// fixed step and restored after a fixed number of steps of the smaller group. Steps are read from
// worker 0's progress record (common/progress_record.h), polled every millisecond; CLOCK_MONOTONIC
// is one clock for all namespaces, events.jsonl's "mono" included. Prints rows; asserts nothing.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "common/progress_record.h"
#include "test/support/main_job.h"
#include "test/support/netns_hosts.h"
#include "test/support/processes.h"

using namespace dtrain::testing;

namespace {

constexpr int kEpochs = 3;
constexpr int kStepsPerEpoch = 200;
constexpr int kSkipSteps = 20;  ///< the first steps of a run or generation, left out of step times
constexpr int64_t kCutAt = 60;  ///< worker 0's global step when the second host's link is cut
constexpr int kShrunkSteps = 120;  ///< steps of the smaller group before the link comes back

double monotonic() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// A step of worker 0 as the poll saw it end.
struct StepSeen {
  double at = 0;
  int generation = 0;
  uint64_t step = 0;
};

// Worker 0's progress record, polled: a step has ended when its global_step or step_micros
// changed (a step redone after a re-formation writes the same global step again). A change of
// step_micros alone within 2 ms of the last step is that step's second store, not a step.
class StepWatch {
 public:
  explicit StepWatch(std::string path) : path_(std::move(path)) {}
  void poll() {
    std::optional<dtrain::common::ProgressSample> r = dtrain::common::read_progress_record(path_);
    if (!r || (r->global_step == step_ && r->step_seconds == seconds_)) return;
    double now = monotonic();
    bool torn = r->global_step == step_ && !steps_.empty() && now - steps_.back().at < 0.002;
    step_ = r->global_step;
    seconds_ = r->step_seconds;
    if (step_ > 0 && !torn) steps_.push_back({now, r->generation, step_});
  }
  int64_t last_step() const { return steps_.empty() ? -1 : static_cast<int64_t>(step_); }
  const std::vector<StepSeen>& steps() const { return steps_; }

 private:
  std::string path_;
  uint64_t step_ = 0;
  double seconds_ = 0;
  std::vector<StepSeen> steps_;
};

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// A launcher event: its CLOCK_MONOTONIC time and generation.
struct Event {
  double mono = 0;
  int generation = 0;
  int steps_redone = 0;  ///< a `recovered` event's
};

// The events of kind in run's events.jsonl, in order.
std::vector<Event> events(const std::string& run, const std::string& kind) {
  std::vector<Event> out;
  for (const std::string& line : lines_of(run + "/events.jsonl")) {
    if (line.find("\"" + kind + "\"") == std::string::npos) continue;
    try {  // the launcher may be writing the last line
      auto e = dtrain::common::JsonDocument::parse(line, "events.jsonl");
      if (e.root().at("event").as_string() != kind) continue;
      Event x;
      x.mono = e.root().at("mono").as_number(0, 1e12);
      if (auto g = e.root().find("generation")) x.generation = static_cast<int>(g->as_int(0, 1e6));
      if (auto s = e.root().find("steps_redone"))
        x.steps_redone = static_cast<int>(s->as_int(0, 1e9));
      out.push_back(x);
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::string job_file(const std::string& dir, const NetnsHosts& hosts, bool elastic) {
  std::string cluster, remote_shell;
  for (int i = 0; i < 4; ++i)
    cluster += (i ? ", \"" : "\"") + hosts.host(i / 2) + ":" + std::to_string(24300 + i % 2) + "\"";
  for (const std::string& arg : hosts.ssh_command())
    remote_shell += (remote_shell.empty() ? "\"" : ", \"") + arg + "\"";
  std::string train = main_job_train(kEpochs, kStepsPerEpoch);
  train.replace(train.find(R"("validation": true)"), 18, R"("validation": false)");
  std::string path = dir + (elastic ? "/job-elastic.json" : "/job-today.json");
  std::ofstream(path) << R"({"job": "elastic-bench", "cluster": {"worker": [)" << cluster
                      << R"(]}, "remote_shell": [)" << remote_shell << "], "
                      << (elastic ? R"("elastic": {"min_workers": 2}, )" : "")
                      << R"("restart": {"max_restarts": 2, "backoff_seconds": 0.2,
                         "grace_seconds": 5}, "env": {"DTRAIN_CACHE_DIR": ")"
                      << dir << R"(/idx-cache"}, )" << train << "}";
  return path;
}

// One `dtrain launch` on the first host and the watch of its worker 0.
class Launch {
 public:
  Launch(const NetnsHosts& hosts, const std::string& job, std::string run)
      : run_(std::move(run)), watch_(run_ + "/progress/worker-0"), launcher_(argv(hosts, job)) {}

  /// Polls every millisecond until done() (then true), the launcher ends or seconds pass.
  bool poll_until(const std::function<bool()>& done, double seconds) {
    double deadline = monotonic() + seconds;
    while (monotonic() < deadline && process_alive(launcher_.pid())) {
      watch_.poll();
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    watch_.poll();
    return false;
  }
  /// Polls to the launcher's end; true when it exited 0.
  bool finish() {
    poll_until([] { return false; }, 600);
    return launcher_.wait(60).exit_code == 0;
  }
  const std::string& run() const { return run_; }
  const StepWatch& watch() const { return watch_; }

 private:
  std::vector<std::string> argv(const NetnsHosts& hosts, const std::string& job) const {
    std::vector<std::string> a = hosts.exec_prefix(0);
    for (const std::string& arg :
         {binary("dtrain"), std::string("launch"), job, std::string("--run-dir"), run_})
      a.push_back(arg);
    return a;
  }
  std::string run_;
  StepWatch watch_;
  BackgroundProcess launcher_;
};

// Median and mean of the intervals between consecutive steps of one generation that end in
// (from, to], after the generation's first `skip` steps seen.
struct Interval {
  double median_ms = -1, mean_ms = -1;
  int count = 0;
};
Interval intervals(const std::vector<StepSeen>& steps, int generation, double from, double to,
                   int skip) {
  std::vector<double> ms;
  int seen = 0;
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].generation != generation || steps[i - 1].generation != generation) continue;
    if (++seen <= skip || steps[i - 1].at <= from || steps[i].at > to) continue;
    ms.push_back((steps[i].at - steps[i - 1].at) * 1e3);
  }
  Interval r;
  r.count = static_cast<int>(ms.size());
  if (ms.empty()) return r;
  double sum = 0;
  for (double x : ms) sum += x;
  r.mean_ms = sum / r.count;
  std::nth_element(ms.begin(), ms.begin() + r.count / 2, ms.end());
  r.median_ms = ms[r.count / 2];
  return r;
}

// The first step seen in generation, or nullopt.
std::optional<double> first_step_in(const std::vector<StepSeen>& steps, int generation) {
  for (const StepSeen& s : steps)
    if (s.generation == generation) return s.at;
  return std::nullopt;
}

std::string sha256_of(const std::string& path) {
  ProcessResult r = run_process({"sha256sum", path});
  return r.exit_code == 0 && r.out.size() >= 64 ? r.out.substr(0, 64) : "none";
}

std::string seconds_text(std::optional<double> s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", s.value_or(-1));
  return s ? text : "-";
}

// An undisturbed run; prints its row and returns the median ms per step.
double undisturbed_run(const NetnsHosts& hosts, const std::string& dir, bool elastic, int rep,
                       std::string& reference) {
  Launch l(hosts, job_file(dir, hosts, elastic),
           dir + "/run-" + (elastic ? "elastic-" : "today-") + std::to_string(rep));
  bool ok = l.finish();
  const std::vector<StepSeen>& steps = l.watch().steps();
  Interval i =
      steps.empty() ? Interval{} : intervals(steps, steps.front().generation, 0, 1e12, kSkipSteps);
  std::string sha = sha256_of(l.run() + "/model/model.safetensors");
  if (reference.empty()) reference = sha;
  std::printf("%-8s %-4d %9.2f %8.2f %6d %.12s %s%s\n", elastic ? "elastic" : "today", rep + 1,
              i.median_ms, i.mean_ms, i.count, sha.c_str(), sha == reference ? "yes" : "no",
              ok ? "" : "  # run failed");
  std::fflush(stdout);
  return i.median_ms;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_full_membership(const NetnsHosts& hosts, const std::string& dir, int reps,
                           std::string& reference) {
  std::printf(
      "\n# 1. full membership, undisturbed, alternated: ms per step = the intervals between "
      "worker 0's\n# consecutive steps after its first %d (median, mean); model = sha256 of "
      "model.safetensors\n",
      kSkipSteps);
  std::printf("job      rep  median_ms  mean_ms  steps model        same\n");
  std::vector<double> today, elastic;
  for (int rep = 0; rep < reps; ++rep) {
    today.push_back(undisturbed_run(hosts, dir, false, rep, reference));
    elastic.push_back(undisturbed_run(hosts, dir, true, rep, reference));
  }
  double a = median(today), b = median(elastic);
  std::printf("# median of the medians: today %.2f ms, elastic %.2f ms, elastic %+.1f %%\n", a, b,
              (b / a - 1) * 100);
}

void print_fault_header() {
  std::printf(
      "\n# 2.-4. elastic, the second host's link cut at worker 0's global step %lld and restored "
      "after %d steps\n# of the smaller group. shrunk_ms / grown_ms: ms per step (median of the "
      "intervals) in the\n# generation the shrink / grow event names, after its first %d steps. "
      "cut_to_shrink_s: the cut to\n# the launcher's shrink event; cut_to_small_step_s: the cut "
      "to worker 0's first step in the\n# shrunk generation; restore_to_grow_s, "
      "restore_to_full_step_s: the same from the link's restore\n# (includes the wait for the "
      "host's next try, back-off 1, 2, 4 ... s after a failed one);\n# failed_tries: the host's "
      "tries that failed (start_failure events of worker:2); redone: the\n# recovered events' "
      "steps_redone; same: the model equals the first undisturbed run's\n",
      static_cast<long long>(kCutAt), kShrunkSteps, kSkipSteps);
  std::printf(
      "rep shrunk_ms grown_ms cut_to_shrink_s cut_to_small_step_s restore_to_grow_s "
      "restore_to_full_step_s failed_tries redone same\n");
}

void print_fault_row(const Launch& l, int rep, const std::string& reference, bool ok, double cut,
                     double restored, std::optional<Event> shrink, std::optional<Event> grow) {
  const std::vector<StepSeen>& steps = l.watch().steps();
  Interval small, full;
  std::optional<double> small_step, full_step, to_shrink, to_grow;
  if (shrink) {
    small = intervals(steps, shrink->generation, cut, restored, kSkipSteps);
    to_shrink = shrink->mono - cut;
    if (auto t = first_step_in(steps, shrink->generation)) small_step = *t - cut;
  }
  if (grow) {
    full = intervals(steps, grow->generation, restored, 1e12, kSkipSteps);
    to_grow = grow->mono - restored;
    if (auto t = first_step_in(steps, grow->generation)) full_step = *t - restored;
  }
  int redone = 0;
  for (const Event& e : events(l.run(), "recovered")) redone += e.steps_redone;
  std::string sha = sha256_of(l.run() + "/model/model.safetensors");
  size_t shrinks = events(l.run(), "shrink").size(), grows = events(l.run(), "grow").size();
  size_t restarts = events(l.run(), "restart").size();
  int failed_tries = 0;  // each try of the host starts both of its tasks; count worker:2's
  for (const std::string& line : lines_of(l.run() + "/events.jsonl"))
    failed_tries += line.find("\"start_failure\"") != std::string::npos &&
                    line.find("\"worker:2\"") != std::string::npos;
  std::printf("%-3d %9.2f %8.2f %15s %19s %17s %22s %12d %6d %s", rep + 1, small.median_ms,
              full.median_ms, seconds_text(to_shrink).c_str(), seconds_text(small_step).c_str(),
              seconds_text(to_grow).c_str(), seconds_text(full_step).c_str(), failed_tries, redone,
              reference.empty()  ? "-"
              : sha == reference ? "yes"
                                 : "no");
  if (!ok || shrinks != 1 || grows != 1 || restarts != 0)
    std::printf("  # exit %s, %zu shrink, %zu grow, %zu restart event(s)", ok ? "0" : "not 0",
                shrinks, grows, restarts);
  std::printf("\n");
  std::fflush(stdout);
}

// A run whose second host is cut at step kCutAt and restored kShrunkSteps steps into the
// smaller group; prints its row.
void fault_run(NetnsHosts& hosts, const std::string& dir, int rep, const std::string& reference) {
  Launch l(hosts, job_file(dir, hosts, true), dir + "/run-fault-" + std::to_string(rep));
  std::vector<Event> shrink, grow;
  double next_read = 0;
  auto seen = [&](const char* kind, std::vector<Event>& into) {  // events.jsonl every 20 ms
    if (monotonic() < next_read) return false;
    next_read = monotonic() + 0.02;
    into = events(l.run(), kind);
    return !into.empty();
  };
  l.poll_until([&] { return l.watch().last_step() >= kCutAt; }, 120);
  hosts.cut_link(1);
  double cut = monotonic();
  bool shrank = l.poll_until([&] { return seen("shrink", shrink); }, 60);
  auto small_steps = [&] {
    int n = 0;
    for (const StepSeen& s : l.watch().steps()) n += shrank && s.generation == shrink[0].generation;
    return n;
  };
  l.poll_until([&] { return small_steps() >= kShrunkSteps; }, shrank ? 120 : 0);
  hosts.restore_link(1);
  double restored = monotonic();
  next_read = 0;
  bool grew = l.poll_until([&] { return seen("grow", grow); }, 120);
  bool ok = l.finish();
  print_fault_row(l, rep, reference, ok, cut, restored, shrank ? shrink[0] : std::optional<Event>(),
                  grew ? grow[0] : std::optional<Event>());
}

}  // namespace

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 3;
  int faults = argc > 2 ? std::atoi(argv[2]) : 2;
  NetnsHosts hosts(2);
  if (!hosts.available()) {
    std::printf("# elastic bench skipped: %s\n", hosts.why_not().c_str());
    return 0;
  }
  std::string dir = hosts.dir() + "/bench";
  std::filesystem::create_directories(dir);
  std::printf(
      "# 2 netns hosts x 2 workers, the main job (batch 64 per worker, %d epochs x %d steps, no "
      "validation),\n# recovery in place; elastic: {\"min_workers\": 2}\n",
      kEpochs, kStepsPerEpoch);
  std::string reference;
  print_full_membership(hosts, dir, reps, reference);
  print_fault_header();
  for (int rep = 0; rep < faults; ++rep) fault_run(hosts, dir, rep, reference);
  return 0;
}
