// `dtrain validate` and `dtrain tf-config`: check a job file and show each task's TF_CONFIG,
// for people who start workers by hand on several machines; `dtrain slurm-script`: the sbatch
// script of a Slurm job. Start nothing (inside an allocation, a Slurm job's cluster is read with
// `scontrol show node`).
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>

#include "common/errors.h"
#include "common/job_spec.h"
#include "common/tf_config.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/in_worker.h"
#include "launcher/cli/options.h"
#include "launcher/placement/slurm.h"
#include "launcher/plan/launch_plan.h"
#include "launcher/plan/run_preparation.h"
#include "launcher/plan/train_check.h"

namespace dtrain::launcher {
namespace po = boost::program_options;
namespace {

// An elastic job whose training tasks all run in one place has no host to let go and take back:
// a lost host ends the job, and a killed worker is only replaced, as in any job (issue 46).
void warn_elastic_on_one_place(const std::string& job_file, const LaunchPlan& plan) {
  if (plan.spec().elastic_min_workers <= 0) return;
  std::set<std::string> places;
  for (const TaskPlan& task : plan.tasks)
    if (task.trains()) places.insert(task.where);
  if (places.size() != 1) return;
  std::cerr << fmt::format(
      "{}: warning: \"elastic\": every training task runs on {}: elastic membership lets a host "
      "go and takes it back, so with one place a lost host ends the job and a killed worker is "
      "replaced as in any job (docs/multi-host.md, elastic membership; to try it on one machine, "
      "make two network-namespace hosts with scripts/elastic-testbed.sh)\n",
      job_file, places.begin()->empty() ? "this machine" : *places.begin());
}

bool in_slurm_allocation() {
  const char* id = std::getenv("SLURM_JOB_ID");
  return id && *id;
}

// The job's cluster as `dtrain launch` would run it: a Slurm job's from its allocation.
common::ClusterSpec job_cluster(const common::JobSpec& spec) {
  return spec.slurm ? read_slurm_allocation(spec).cluster() : common::resolve_cluster(spec);
}

// A "workers": N job's ports are picked by `dtrain launch`: the ones this call shows were free a
// moment ago and the next call picks others, so workers started by hand from them never meet.
void warn_ports_picked_at_launch(const std::string& job_file, const common::JobSpec& spec,
                                 const common::ClusterSpec& cluster) {
  if (spec.auto_workers == 0) return;
  std::string picked;
  for (const common::TaskId& task : cluster.tasks())
    picked += (picked.empty() ? "" : ", ") + cluster.address(task);
  std::cerr << fmt::format(
      "dtrain: warning: {} has \"workers\": {}, whose ports `dtrain launch` picks when it "
      "starts; this call picked {}, which were free just now, and another call picks others. "
      "For workers started by hand, give \"cluster\" with fixed addresses instead.\n",
      job_file, spec.auto_workers, picked);
}

}  // namespace

int validate_command(const Args& args) {
  std::string job_file;
  po::options_description desc(
      "Usage: dtrain validate JOB_FILE\n\n"
      "Checks a job file and prints the TF_CONFIG each task would get. Where every task runs on\n"
      "this machine, it also opens the data as the workers will (an image folder is scanned,\n"
      "not decoded) and checks it against the model and the loss.\n\n"
      "Options");
  desc.add_options()("help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {{"job-file", &job_file}}, "validate");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  common::JobSpec spec = common::load_job_spec(job_file);
  check_train_section(spec);
  const std::string data_line = spec.command.empty() && spec.train_json && trains_here(spec)
                                    ? check_data_in_worker(job_file)
                                    : "";
  if (spec.slurm && !in_slurm_allocation()) {
    std::cout << fmt::format(
        "{}: OK: job \"{}\", a Slurm job: its workers are the tasks of the allocation it runs "
        "in ({} node(s) x {} task(s) in `dtrain slurm-script {}`), run directory {}\n",
        job_file, spec.job, spec.slurm_options.nodes, spec.slurm_options.tasks_per_node, job_file,
        spec.run_dir);
    return 0;
  }
  common::ClusterSpec cluster = job_cluster(spec);
  // Every check `dtrain launch` makes while planning (elastic.min_workers against the job's
  // training tasks, ...), so that what validate accepts, launch does too (issue 43).
  LaunchContext context = make_launch_context(spec, run_root(spec));
  context.cluster = cluster;
  const LaunchPlan plan = plan_launch(std::move(context));
  warn_elastic_on_one_place(job_file, plan);
  std::cout << fmt::format("{}: OK: job \"{}\", {} training task(s), chief {}, run directory {}\n",
                           job_file, spec.job, cluster.ring_size(), cluster.chief().text(),
                           spec.run_dir);
  if (!data_line.empty()) std::cout << data_line << "\n";
  if (spec.auto_workers > 0) {
    std::cout << "# \"workers\": ports below were free just now; `dtrain launch` picks its own\n";
    warn_ports_picked_at_launch(job_file, spec, cluster);
  }
  for (const common::TaskId& task : cluster.tasks()) {
    std::cout << fmt::format("# {}{}\n", task.text(), cluster.is_chief(task) ? " (chief)" : "");
    std::cout << "TF_CONFIG='" << common::format_tf_config(cluster, task) << "'\n";
  }
  return 0;
}

int tf_config_command(const Args& args) {
  std::string job_file;
  std::string task_text;
  po::options_description desc(
      "Usage: dtrain tf-config JOB_FILE --task TYPE:INDEX\n\n"
      "Prints the TF_CONFIG of one task, e.g.\n"
      "  export TF_CONFIG=\"$(dtrain tf-config job.json --task worker:1)\"\n\n"
      "Options");
  desc.add_options()("task", po::value(&task_text), "the task, e.g. worker:1 or chief:0")(
      "help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {{"job-file", &job_file}}, "tf-config");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (task_text.empty()) throw common::ConfigError("tf-config: --task TYPE:INDEX is required");
  common::JobSpec spec = common::load_job_spec(job_file);
  common::ClusterSpec cluster = job_cluster(spec);
  common::TaskId task = common::parse_task_id(task_text);
  if (!cluster.has(task)) {
    throw common::ConfigError(fmt::format("--task {}: {} has no such task (it has {} {} task(s))",
                                          task_text, job_file, cluster.count(task.type),
                                          task.type));
  }
  warn_ports_picked_at_launch(job_file, spec, cluster);
  std::cout << common::format_tf_config(cluster, task) << "\n";
  return 0;
}

int slurm_script_command(const Args& args) {
  std::string job_file;
  po::options_description desc(
      "Usage: dtrain slurm-script JOB_FILE > job.sbatch; sbatch job.sbatch\n\n"
      "Prints a bash sbatch script for a job with \"cluster\": \"slurm\": the job file's "
      "slurm.nodes\nand slurm.tasks_per_node (one task per worker), --requeue, SIGTERM to the "
      "steps\nslurm.signal_lead_seconds before the time limit, and a requeue when the launch "
      "ends\npreempted (143), so the next run resumes from the checkpoint.\n\nOptions");
  desc.add_options()("help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {{"job-file", &job_file}}, "slurm-script");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  common::JobSpec spec = common::load_job_spec(job_file);
  if (!spec.slurm) {
    throw common::ConfigError(fmt::format(
        "{}: \"cluster\" is not \"slurm\": slurm-script is for jobs whose workers Slurm "
        "allocates",
        job_file));
  }
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string cwd = std::filesystem::current_path().string();
  std::cout << slurm_script(spec, std::filesystem::absolute(job_file).lexically_normal().string(),
                            ec ? std::string("dtrain") : self.string(), cwd);
  return 0;
}

}  // namespace dtrain::launcher
