// See group_view.h.
#include "launcher/view/group_view.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/json.h"

namespace dtrain::launcher {
namespace {

void write_progress(common::JsonWriter& w, const common::ControlMessage& p) {
  w.key("last_progress").begin_object();
  if (p.epoch) w.key("epoch").value(*p.epoch);
  if (p.epochs) w.key("epochs").value(*p.epochs);
  if (p.step) w.key("step").value(*p.step);
  if (p.steps) w.key("steps").value(*p.steps);
  if (p.global_step) w.key("global_step").value(*p.global_step);
  if (p.loss) w.key("loss").value(*p.loss);
  if (p.accuracy) w.key("accuracy").value(*p.accuracy);
  if (p.samples_per_second) w.key("samples_per_second").value(*p.samples_per_second);
  if (p.compute_seconds_per_step)
    w.key("compute_seconds_per_step").value(*p.compute_seconds_per_step);
  if (p.wait_seconds_per_step) w.key("wait_seconds_per_step").value(*p.wait_seconds_per_step);
  w.end_object();
}

void write_task(common::JsonWriter& w, const TaskSnapshot& t) {
  w.begin_object()
      .key("task")
      .value(t.task)
      .key("address")
      .value(t.address)
      .key("log")
      .value(t.log_path)
      .key("pid")
      .value(t.pid)
      .key("state")
      .value(t.state);
  if (t.status)
    w.key("exit")
        .value(describe(*t.status))
        .key("outcome")
        .value(outcome_name(classify(*t.status)));
  if (t.progress) write_progress(w, *t.progress);
  if (t.pid != 0) w.key("progress_age_seconds").value(t.progress_age_seconds);
  w.end_object();
}

void write_straggler(common::JsonWriter& w, const Straggler& s) {
  w.key("straggler")
      .begin_object()
      .key("task")
      .value(s.task)
      .key("compute_seconds_per_step")
      .value(s.compute_seconds_per_step)
      .key("others_median_seconds")
      .value(s.others_median_seconds)
      .end_object();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t half = values.size() / 2;
  return values.size() % 2 ? values[half] : (values[half - 1] + values[half]) / 2;
}

}  // namespace

std::optional<Straggler> find_straggler(const std::vector<TaskSnapshot>& tasks) {
  std::vector<std::pair<double, const TaskSnapshot*>> reported;
  for (const TaskSnapshot& t : tasks) {
    if (t.progress && t.progress->compute_seconds_per_step)
      reported.emplace_back(*t.progress->compute_seconds_per_step, &t);
  }
  if (reported.size() < 2) return std::nullopt;
  auto slowest = std::max_element(reported.begin(), reported.end(),
                                  [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<double> others;
  for (auto it = reported.begin(); it != reported.end(); ++it)
    if (it != slowest) others.push_back(it->first);
  double rest = median(others);
  if (slowest->first <= kStragglerRatio * rest ||
      slowest->first - rest < kStragglerMinExcessSeconds)
    return std::nullopt;
  return Straggler{slowest->second->task, slowest->first, rest};
}

std::optional<Straggler> StragglerWatch::look(const std::vector<TaskSnapshot>& tasks) {
  std::optional<Straggler> now = find_straggler(tasks);
  if (!now) {
    candidate_.clear(), windows_ = 0;
    return std::nullopt;
  }
  int64_t step = -1;
  for (const TaskSnapshot& t : tasks)
    if (t.task == now->task && t.progress && t.progress->global_step)
      step = *t.progress->global_step;
  if (now->task != candidate_) {
    candidate_ = now->task, windows_ = 1, counted_step_ = step;
  } else if (step > counted_step_) {
    ++windows_, counted_step_ = step;
  }
  // A lasting verdict, with the newest figures.
  return windows_ >= kStragglerWindows ? now : std::nullopt;
}

std::string state_json(const GroupSnapshot& g) {
  common::JsonWriter w;
  w.begin_object()
      .key("job")
      .value(g.job)
      .key("run_dir")
      .value(g.run_dir)
      .key("launcher_pid")
      .value(g.launcher_pid)
      .key("status")
      .value(g.status)
      .key("attempt")
      .value(g.attempt)
      .key("generation")
      .value(g.generation)
      .key("restarts")
      .value(g.restarts)
      .key("preemptions")
      .value(g.preemptions)
      .key("in_place_recoveries")
      .value(g.in_place_recoveries)
      .key("steps_redone")
      .value(g.steps_redone)
      .key("uptime_seconds")
      .value(g.uptime_seconds)
      .key("updated_at")
      .value(g.updated_at);
  if (g.reason) w.key("reason").value(*g.reason).key("exit_code").value(g.exit_code);
  if (g.world_size) {
    w.key("world_size").value(*g.world_size).key("membership").begin_array();
    for (const MembershipPoint& p : g.membership) {
      w.begin_object().key("at").value(p.at).key("generation").value(p.generation);
      w.key("world_size").value(p.world_size).end_object();
    }
    w.end_array();
  }
  w.key("workers").begin_array();
  for (const TaskSnapshot& t : g.tasks) write_task(w, t);
  w.end_array();
  if (g.straggler) write_straggler(w, *g.straggler);
  if (g.failure) {
    w.key("failure")
        .begin_object()
        .key("task")
        .value(g.failure->task)
        .key("attempt")
        .value(g.failure->attempt)
        .key("what")
        .value(g.failure->what)
        .key("outcome")
        .value(outcome_name(g.failure->outcome))
        .end_object();
  }
  return w.end_object().str();
}

std::optional<int64_t> reported_step(const common::ControlMessage& p) {
  if (p.global_step) return p.global_step;
  if (p.epoch && p.steps && p.step) return int64_t{*p.epoch - 1} * *p.steps + *p.step;
  return std::nullopt;
}

std::string prometheus_text(const GroupSnapshot& g) {
  std::string job = common::json_quote(g.job);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP dtrain_{} {}\n# TYPE dtrain_{} {}\n", name, help, name, type);
  };
  metric("restarts_total", "counter", "Group restarts after failures.");
  out += fmt::format("dtrain_restarts_total{{job={}}} {}\n", job, g.restarts);
  metric("preemptions_total", "counter", "Group restarts after preemptions.");
  out += fmt::format("dtrain_preemptions_total{{job={}}} {}\n", job, g.preemptions);
  metric("steps_redone_total", "counter", "Training steps redone after recoveries.");
  out += fmt::format("dtrain_steps_redone_total{{job={}}} {}\n", job, g.steps_redone);
  metric("attempt", "gauge", "Current attempt of the group (DTRAIN_ATTEMPT).");
  out += fmt::format("dtrain_attempt{{job={}}} {}\n", job, g.attempt);
  metric("generation", "gauge",
         "Generation of the current attempt (DTRAIN_GENERATION): workers replaced in place.");
  out += fmt::format("dtrain_generation{{job={}}} {}\n", job, g.generation);
  metric("in_place_recoveries_total", "counter",
         "Re-formations in place after which the group stepped on.");
  out += fmt::format("dtrain_in_place_recoveries_total{{job={}}} {}\n", job, g.in_place_recoveries);
  if (g.world_size) {
    metric("world_size", "gauge", "Training workers in the elastic group now.");
    out += fmt::format("dtrain_world_size{{job={}}} {}\n", job, *g.world_size);
  }
  metric("worker_up", "gauge", "1 while the worker process runs.");
  for (const TaskSnapshot& t : g.tasks) {
    bool up = t.pid != 0 && !t.status;
    out += fmt::format("dtrain_worker_up{{job={},task=\"{}\"}} {}\n", job, t.task, up ? 1 : 0);
  }
  metric("worker_loss", "gauge",
         "Running mean loss of the current epoch, as the worker last reported it.");
  metric("worker_samples_per_second", "gauge",
         "Training samples per second the worker last reported.");
  metric("worker_global_step", "gauge", "Steps the worker reports done (epoch * steps + step).");
  metric("worker_compute_seconds_per_step", "gauge",
         "Seconds per step the worker computed, outside all-reduces (mean since its last report).");
  metric("worker_allreduce_wait_seconds_per_step", "gauge",
         "Seconds per step the worker waited for all-reduces (mean since its last report).");
  metric("worker_straggler", "gauge",
         "1 for the worker whose compute time holds the group back, 0 for the others.");
  const std::optional<Straggler>& straggler = g.straggler;
  for (const TaskSnapshot& t : g.tasks) {
    if (!t.progress) continue;
    const common::ControlMessage& p = *t.progress;
    std::string labels = fmt::format("job={},task=\"{}\"", job, t.task);
    if (p.loss) out += fmt::format("dtrain_worker_loss{{{}}} {}\n", labels, *p.loss);
    if (p.samples_per_second)
      out +=
          fmt::format("dtrain_worker_samples_per_second{{{}}} {}\n", labels, *p.samples_per_second);
    if (auto step = reported_step(p))
      out += fmt::format("dtrain_worker_global_step{{{}}} {}\n", labels, *step);
    if (!p.compute_seconds_per_step) continue;
    out += fmt::format("dtrain_worker_compute_seconds_per_step{{{}}} {}\n", labels,
                       *p.compute_seconds_per_step);
    if (p.wait_seconds_per_step)
      out += fmt::format("dtrain_worker_allreduce_wait_seconds_per_step{{{}}} {}\n", labels,
                         *p.wait_seconds_per_step);
    bool slowest = straggler && straggler->task == t.task;
    out += fmt::format("dtrain_worker_straggler{{{}}} {}\n", labels, slowest ? 1 : 0);
  }
  return out;
}

std::string live_line(int attempt, const common::ControlMessage& p, double steps_per_second) {
  if (!p.epoch || !p.epochs || !p.step || !p.steps) return "";
  int64_t done = int64_t{*p.epoch - 1} * *p.steps + *p.step, total = int64_t{*p.epochs} * *p.steps;
  std::string eta =
      steps_per_second > 0 ? fmt::format("{:.0f}s", (total - done) / steps_per_second) : "?";
  const std::string rate = p.tokens_per_second
                               ? fmt::format("{:.0f} tokens/s", *p.tokens_per_second)
                               : fmt::format("{:.0f} samples/s", p.samples_per_second.value_or(0));
  return fmt::format(
      "attempt {}  epoch {}/{}  step {}/{}  loss {:.4f}  accuracy {:.4f}  {}  ETA {}", attempt,
      *p.epoch, *p.epochs, *p.step, *p.steps, p.loss.value_or(0), p.accuracy.value_or(0), rate,
      eta);
}

}  // namespace dtrain::launcher
