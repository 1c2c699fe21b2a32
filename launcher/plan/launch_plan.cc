// See launch_plan.h. Everything that depends on where tasks run is computed here in one pass
// over the tasks, so that building a spawn request later is a pure lookup.
#include "launcher/plan/launch_plan.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/local_addresses.h"
#include "common/ports.h"
#include "common/run_dir.h"
#include "launcher/plan/train_section.h"

namespace dtrain::launcher {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool user_sets(const common::JobSpec& spec, const char* name) {
  return std::any_of(spec.env.begin(), spec.env.end(),
                     [&](const auto& kv) { return kv.first == name; });
}

// Placement and host of every task; each distinct host is resolved once.
void place_tasks(LaunchPlan& plan) {
  const LaunchContext& c = plan.context;
  std::map<std::string, bool> local_hosts;
  std::map<std::string, std::vector<std::string>> numeric;
  common::RunDir run_dir(c.run_dir);
  for (const common::TaskId& id : c.cluster.tasks()) {
    TaskPlan t;
    t.task = id;
    t.address = c.cluster.address(id);
    t.endpoint = common::parse_host_port(t.address, id.text());
    t.log_path = run_dir.log_file(id);
    t.rank = c.cluster.ring_rank(id);
    if (c.slurm) {
      t.placement = Placement::kSlurmStep;
      t.slurm_index = static_cast<size_t>(id.index);
      t.where = c.slurm->tasks.at(t.slurm_index).node;
    } else {
      auto known = local_hosts.find(t.endpoint.host);
      if (known == local_hosts.end())
        known = local_hosts.emplace(t.endpoint.host, is_local_host(t.endpoint.host)).first;
      t.placement = known->second ? Placement::kLocal : Placement::kRemoteShell;
      if (t.remote()) t.where = lower(t.endpoint.host);
      if (!t.remote()) {
        auto addresses = numeric.find(t.endpoint.host);
        if (addresses == numeric.end())
          addresses =
              numeric.emplace(t.endpoint.host, common::listen_addresses(t.endpoint.host)).first;
        t.listen_addresses = addresses->second;
      }
    }
    if (t.trains() && c.spec->command.empty())
      t.progress_path = t.remote() ? std::string(kAgentProgressPath) : run_dir.progress_file(id);
    plan.tasks.push_back(std::move(t));
  }
}

// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK in rank order, and threads per task of each host.
void number_ranks(LaunchPlan& plan) {
  std::vector<TaskPlan*> ring;
  for (TaskPlan& t : plan.tasks)
    if (t.trains()) ring.push_back(&t);
  std::sort(ring.begin(), ring.end(), [](auto* a, auto* b) { return *a->rank < *b->rank; });
  std::map<std::string, int> place_number, place_count;
  for (TaskPlan* t : ring) {
    place_number.emplace(t->where, static_cast<int>(place_number.size()));
    t->group_rank = place_number.at(t->where);
    t->local_rank = place_count[t->where]++;
  }
  for (TaskPlan* t : ring) t->local_world_size = place_count.at(t->where);
  plan.training_tasks = static_cast<int>(ring.size());
  plan.places = static_cast<int>(place_number.size());
}

// OMP_NUM_THREADS (cores of the host over its tasks, or the Slurm step's CPUs) and the local
// GPUs, handed out round-robin in task order.
void share_host(LaunchPlan& plan) {
  const LaunchContext& c = plan.context;
  bool user_omp = user_sets(*c.spec, common::kEnvOmpThreads.name);
  std::map<std::string, int> per_host;
  for (const TaskPlan& t : plan.tasks) ++per_host[t.endpoint.host];
  size_t local = 0;
  for (TaskPlan& t : plan.tasks) {
    if (c.slurm && !user_omp) {
      t.omp_threads = c.slurm->tasks.at(t.slurm_index).cpus;
    } else if (!user_omp && !c.launcher_omp_threads) {
      t.omp_threads = std::max(1, c.host_cores / std::max(1, per_host.at(t.endpoint.host)));
    }
    if (t.placement != Placement::kLocal || c.local_gpus <= 0) continue;
    size_t slot = local++ % static_cast<size_t>(c.local_gpus);
    t.gpu = slot < c.gpu_names.size() ? c.gpu_names[slot] : std::to_string(slot);
  }
  if (c.local_gpus > 0 && local > static_cast<size_t>(c.local_gpus) && !c.spec->gpu_sharing) {
    throw common::ConfigError(
        fmt::format("{}: {} local tasks but {} GPU(s) on this host: set \"gpu_sharing\": true to "
                    "let workers share GPUs, or use fewer workers",
                    c.spec->source, local, c.local_gpus));
  }
  if (user_sets(*c.spec, common::kEnvCudaDevices.name))
    for (TaskPlan& t : plan.tasks) t.gpu.clear();
}

// Why GPU workers here could not keep whole steps (empty when they can): only a communicator
// staged through host memory can (worker/train/train_step.h), which is train.communication
// "ring" or "shm", or "auto" when local workers share GPUs (NCCL refuses that).
std::string gpu_in_place_obstacle(const LaunchPlan& plan, comm::Communication communication) {
  using comm::Communication;
  if (communication == Communication::kRing || communication == Communication::kShm) return "";
  size_t local = 0;
  for (const TaskPlan& t : plan.tasks)
    if (t.trains() && t.placement == Placement::kLocal) ++local;
  if (communication == Communication::kAuto && local > static_cast<size_t>(plan.context.local_gpus))
    return "";
  return fmt::format(
      "train.communication \"{}\" can be NCCL, which cannot re-form: set "
      "\"ring\" for recovery in place on GPUs",
      comm::communication_name(communication));
}

// In place for dtrain-worker jobs: the launcher starts a replacement on the same place (a
// process here, a new agent session on the same host, a new step on the same node).
void choose_recovery(LaunchPlan& plan) {
  if (plan.spec().recovery != common::RecoveryMode::kInPlace || !plan.spec().command.empty())
    return;
  // Other hosts' GPUs are not seen from here: a launcher with none takes "auto" for CPUs on
  // every host.
  const train::TrainConfig config = read_train_section(plan.spec()).value_or(train::TrainConfig{});
  using train::DeviceChoice;
  bool gpu = (plan.context.local_gpus > 0 && config.device != DeviceChoice::kCpu) ||
             config.device == DeviceChoice::kCuda;
  if (gpu) {
    bool remote = false;
    for (const TaskPlan& t : plan.tasks) remote = remote || t.placement != Placement::kLocal;
    std::string obstacle = remote ? "GPU workers on other hosts are not yet recovered in place"
                                  : gpu_in_place_obstacle(plan, config.communication);
    if (!obstacle.empty()) {
      plan.recovery_note = fmt::format("recovery: restart ({})", obstacle);
      return;
    }
  }
  plan.in_place = true;
}

// docs/design.md#elastic-membership: in place, on CPUs, and never below one worker.
void plan_elastic(LaunchPlan& plan) {
  const common::JobSpec& spec = plan.spec();
  if (spec.elastic_min_workers == 0) return;
  if (!plan.in_place && spec.command.empty()) {
    throw common::ConfigError(fmt::format(
        "{}: elastic: an elastic dtrain-worker job re-forms its group in place, which this one "
        "cannot ({})",
        spec.source, plan.recovery_note));
  }
  if (spec.elastic_min_workers > plan.training_tasks) {
    throw common::ConfigError(
        fmt::format("{}: elastic.min_workers: {} is more than the job's {} training task(s)",
                    spec.source, spec.elastic_min_workers, plan.training_tasks));
  }
  plan.elastic_min_workers = spec.elastic_min_workers;
}

// `spares` spares idle on each place of the training tasks (this machine, and each ssh host) until
// one of that place's tasks fails (docs/design.md#spares): a spare takes the place of a task of
// its own place, where the task's address is. Places in rank order of first use; each spare gets
// the threads a worker of its place gets. Slurm steps have none (a step is started by srun).
void plan_spares(LaunchPlan& plan) {
  const LaunchContext& c = plan.context;
  if (!plan.in_place || c.spec->spares <= 0) return;
  common::RunDir run_dir(c.run_dir);
  std::vector<const TaskPlan*> places;  // a training task of each place
  for (const TaskPlan& t : plan.tasks) {
    if (!t.trains() || t.placement == Placement::kSlurmStep) continue;
    bool known = false;
    for (const TaskPlan* p : places) known |= p->placement == t.placement && p->where == t.where;
    if (!known) places.push_back(&t);
  }
  int index = 0;
  for (const TaskPlan* worker : places) {
    for (int i = 0; i < c.spec->spares; ++i) {
      TaskPlan t;
      t.task = common::TaskId{kSpareType, index++};
      t.placement = worker->placement;
      t.where = worker->where;
      t.endpoint.host = worker->endpoint.host;  // what the remote shell is given; no port
      t.listen_addresses = worker->listen_addresses;
      t.log_path = run_dir.log_file(t.task);
      t.progress_path =
          t.remote() ? std::string(kAgentProgressPath) : run_dir.progress_file(t.task);
      t.omp_threads = worker->omp_threads;
      plan.spares.push_back(std::move(t));
    }
  }
}

}  // namespace

LaunchPlan members_plan(const LaunchPlan& plan, const std::set<common::TaskId>& away) {
  LaunchPlan view = plan;
  std::vector<common::ClusterSpec::Job> jobs;
  std::map<common::TaskId, common::TaskId> renamed;
  for (const auto& [type, addresses] : plan.context.cluster.jobs()) {
    std::vector<std::string> kept;
    for (size_t i = 0; i < addresses.size(); ++i) {
      common::TaskId id{type, static_cast<int>(i)};
      if (away.count(id)) continue;
      renamed.emplace(id, common::TaskId{type, static_cast<int>(kept.size())});
      kept.push_back(addresses[i]);
    }
    if (!kept.empty()) jobs.emplace_back(type, std::move(kept));
  }
  view.context.cluster = common::ClusterSpec(std::move(jobs));
  view.cluster_json = view.context.cluster.to_python_json();
  view.tasks.clear();
  for (const TaskPlan& t : plan.tasks) {
    auto now = renamed.find(t.task);
    if (now == renamed.end()) continue;
    TaskPlan kept = t;
    kept.task = now->second;
    kept.rank = view.context.cluster.ring_rank(kept.task);
    view.tasks.push_back(std::move(kept));
  }
  number_ranks(view);
  return view;
}

int choose_master_port(const LaunchPlan& plan) {
  const common::JobSpec& spec = plan.spec();
  if (spec.master_port) return *spec.master_port;
  if (user_sets(spec, common::kEnvMasterPort.name)) return 0;  // the job's own value is used
  std::set<int> taken;  // the ports the cluster's tasks listen on (any host)
  for (const TaskPlan& t : plan.tasks) taken.insert(t.endpoint.port);
  if (plan.master_local) {
    // Ask for a few at once: one of them could be a task's (the OS does not know the cluster).
    for (int port : common::pick_free_ports(static_cast<int>(taken.size()) + 1)) {
      if (!taken.count(port)) return port;
    }
  }
  int port = plan.task(plan.context.cluster.chief()).endpoint.port + 1;
  while (port <= 65535 && taken.count(port)) ++port;
  if (port > 65535) {
    spdlog::warn(
        "{}: no port above the chief's is left for MASTER_PORT, so it is not set (a PyTorch "
        "program needs it: set \"master_port\" or MASTER_PORT in \"env\")",
        spec.source);
    return 0;
  }
  return port;
}

std::string TaskPlan::place_text() const {
  switch (placement) {
    case Placement::kLocal:
      return "this machine";
    case Placement::kRemoteShell:
      return "host " + where;
    case Placement::kSlurmStep:
      return "node " + where;
  }
  return where;
}

const TaskPlan& LaunchPlan::task(const common::TaskId& id) const {
  for (const TaskPlan& t : tasks)
    if (t.task == id) return t;
  DT_ENFORCE(false, "task {} is not in the plan", id.text());
  return tasks.front();
}

bool is_local_host(const std::string& host) {
  return common::is_this_machine(host);
}

LaunchPlan plan_launch(LaunchContext context) {
  LaunchPlan plan;
  plan.context = std::move(context);
  plan.cluster_json = plan.context.cluster.to_python_json();
  place_tasks(plan);
  number_ranks(plan);
  share_host(plan);
  const TaskPlan& chief = plan.task(plan.context.cluster.chief());
  plan.master_addr = chief.endpoint.host;
  plan.master_local = chief.placement == Placement::kLocal;
  plan.master_port = choose_master_port(plan);
  choose_recovery(plan);
  plan_elastic(plan);
  plan_spares(plan);
  return plan;
}

}  // namespace dtrain::launcher
