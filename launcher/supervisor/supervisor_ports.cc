// See supervisor.h. The ports a start needs: every local task's, and MASTER_PORT for a local
// chief, checked free on the addresses the plan resolved; the launcher's own picks (MASTER_PORT,
// "workers": N ports) are picked again when taken, the user's are retried on a restart.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/exit_codes.h"
#include "common/ports.h"
#include "common/run_dir.h"
#include "launcher/plan/launch_plan.h"
#include "launcher/plan/worker_env.h"
#include "launcher/supervisor/supervisor.h"
#include "launcher/supervisor/supervisor_task.h"

namespace dtrain::launcher {
namespace {
constexpr double kPortRetrySeconds = 0.25;
constexpr int kPortRetries = 40;
}  // namespace

// Every local worker port, and MASTER_PORT when the chief is local, must be free before a start.
// The addresses were resolved by the plan: no resolver runs here.
bool Supervisor::ports_free_or_retry() {
  struct Needed {
    common::HostPort where;
    const std::vector<std::string>* addresses;
    std::string who;
    size_t task = 0;  ///< plan index of a task's port
  };
  std::vector<Needed> needed;
  for (size_t i = 0; i < plan_.tasks.size(); ++i) {
    const TaskPlan& t = plan_.tasks[i];
    if (t.placement == Placement::kLocal)
      needed.push_back({{t.endpoint.host, ports_[i]}, &t.listen_addresses, t.task.text(), i});
  }
  if (plan_.master_local && master_port_ > 0) {
    const TaskPlan& chief = plan_.task(plan_.context.cluster.chief());
    needed.push_back({{plan_.master_addr, master_port_}, &chief.listen_addresses, "MASTER_PORT"});
  }
  for (const Needed& n : needed) {
    if (std::all_of(n.addresses->begin(), n.addresses->end(), [&](const std::string& address) {
          return common::is_port_free(address, n.where.port);
        }))
      continue;
    if (n.who == "MASTER_PORT" && !plan_.spec().master_port) {  // ours to pick again
      master_port_ = choose_master_port(plan_);
      spdlog::info("MASTER_PORT {} was taken; picked {}", n.where.port, master_port_);
      continue;
    }
    if (n.who != "MASTER_PORT" && plan_.spec().auto_workers > 0) {  // "workers": N: ours too
      repick_port(n.task);
      continue;
    }
    // On the first start a busy port is the user's to fix; on a restart it may be our own
    // previous worker still letting go of it.
    if (attempt_ > options_.first_attempt && port_retries_++ < kPortRetries) {
      port_timer_->expires_after(kPortRetrySeconds);
      port_timer_->async_wait([this](const boost::system::error_code& ec) {
        if (!ec && phase_ == Phase::kStarting) guarded("port retry", [this] { start_attempt(); });
      });
      return false;
    }
    bool v6 = n.where.host.find(':') != std::string::npos;
    std::string what = fmt::format("port {}{}{}:{} of {} is in use by another program ({})",
                                   v6 ? "[" : "", n.where.host, v6 ? "]" : "", n.where.port, n.who,
                                   n.who == "MASTER_PORT" ? "free it or change master_port"
                                                          : "free it or change the job's cluster");
    finish(common::kStatusFailed, common::kExitConfig, what);
    return false;
  }
  return true;
}

// A port the launcher picked for a "workers": N task was taken (by another program, during the
// back-off): it picks another, and every task's TF_CONFIG of this start names it.
void Supervisor::repick_port(size_t task) {
  int old = ports_[task];
  for (int port : common::pick_free_ports(static_cast<int>(ports_.size()) + 1)) {
    if (std::find(ports_.begin(), ports_.end(), port) != ports_.end() || port == master_port_)
      continue;
    ports_[task] = port;
    break;
  }
  cluster_json_ = cluster_json_with_ports(plan_, ports_);
  spdlog::info("{}: port {} was taken; picked {}", plan_.tasks[task].task.text(), old,
               ports_[task]);
  recorder_.event("port", [&](common::JsonWriter& w) {
    w.key("task")
        .value(plan_.tasks[task].task.text())
        .key("taken")
        .value(old)
        .key("port")
        .value(ports_[task]);
  });
}

}  // namespace dtrain::launcher
