// See supervisor.h. Slurm's word on a node (docs/design.md#elastic-membership): a drained node
// still runs new job steps, so before an elastic group keeps or retries a node the launcher asks
// `scontrol show node`. The question is a side run on the event loop, like the host discovery
// program: heartbeats, reform requests and the freeze watch go on while Slurm answers, and the
// decision that needed the answer (a failed end, a host's try) goes on when it comes.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "launcher/placement/slurm.h"
#include "launcher/process/exit_status.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {

/// Of its output, what is read (one node's line is a few hundred bytes).
constexpr size_t kMaxNodeStateBytes = 64 * 1024;

/// The last line of a failed run's output, for the warning.
std::string last_line(const std::string& output) {
  std::string text = output;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  size_t eol = text.rfind('\n');
  return eol == std::string::npos ? text : text.substr(eol + 1);
}

}  // namespace

void Supervisor::ask_slurm(const std::string& node, std::function<void(const std::string&)> then) {
  NodeQuestion& question = node_questions_[node];
  question.waiting.push_back(std::move(then));
  if (question.run.running) return;  // its answer serves every caller
  SpawnRequest request;
  request.argv = node_state_argv(node);
  request.cwd = plan_.context.cwd;
  bool started = start_side_run(question.run, request, "scontrol show node " + node,
                                options_.slurm_question_seconds, kMaxNodeStateBytes,
                                [this, node](const ChildEnd& end) { on_node_answer(node, end); });
  if (started) return;
  // Not started (said by start_side_run): usable, as when scontrol fails; answered from the
  // loop, never inside the caller's decision.
  spdlog::warn("cannot ask Slurm about node {}; taking it as usable", node);
  boost::asio::post(
      io_, [this, node] { guarded("Slurm question", [&] { answer_node_question(node, ""); }); });
}

void Supervisor::on_node_answer(const std::string& node, const ChildEnd& end) {
  NodeQuestion& question = node_questions_[node];
  std::string leaving;
  if (question.run.abandoned) {
    spdlog::warn("Slurm did not say within {:g} s how node {} is; taking it as usable",
                 options_.slurm_question_seconds, node);
  } else if (end.status.signaled || end.status.code != 0 || question.run.overflowed) {
    spdlog::warn("cannot ask Slurm about node {}; taking it as usable: scontrol {}{}", node,
                 question.run.overflowed ? "printed too much" : describe(end.status),
                 question.run.output.empty() ? "" : ": " + last_line(question.run.output));
  } else {
    leaving = node_leaving_state(question.run.output, node);
  }
  answer_node_question(node, leaving);
}

void Supervisor::answer_node_question(const std::string& node, const std::string& leaving) {
  NodeQuestion& question = node_questions_[node];
  std::vector<std::function<void(const std::string&)>> waiting = std::move(question.waiting);
  question.waiting.clear();
  for (auto& then : waiting) then(leaving);
}

void Supervisor::hold_for_slurm(Task& task, const EndReading& reading, const ChildEnd& end) {
  spdlog::info("{}: asking Slurm whether node {} is leaving", task.plan.task.text(),
               task.plan.where);
  held_ends_.push_back(HeldEnd{&task, reading, end});
  Task* held = &task;
  ask_slurm(task.plan.where, [this, held](const std::string& leaving) {
    auto it = std::find_if(held_ends_.begin(), held_ends_.end(),
                           [&](const HeldEnd& h) { return h.task == held; });
    if (it == held_ends_.end()) return;  // settled meanwhile: the group is stopping
    HeldEnd h = std::move(*it);
    held_ends_.erase(it);
    h.reading.node_leaving = leaving;
    decide_end(*h.task, h.reading, h.end);
    write_state();
    maybe_teardown_complete();
  });
}

void Supervisor::settle_held_ends() {
  std::vector<HeldEnd> held = std::move(held_ends_);
  held_ends_.clear();
  for (const HeldEnd& h : held) {
    if (!fail_first(*h.task, h.reading.outcome, h.reading.what, h.reading.exit_code)) continue;
    first_failure_->never_started = !h.reading.started;
    first_failure_->sigkill = h.reading.started && killed_by_sigkill(h.end.status);
    first_failure_->place_lost = h.reading.place_lost;
  }
}

}  // namespace dtrain::launcher
