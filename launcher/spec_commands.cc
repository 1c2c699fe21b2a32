// `dtrain validate` and `dtrain tf-config`: check a job file and show each task's TF_CONFIG,
// for people who start workers by hand on several machines. Starts nothing.
#include <boost/program_options.hpp>
#include <iostream>

#include "common/errors.h"
#include "common/job_spec.h"
#include "common/tf_config.h"
#include "launcher/commands.h"
#include "launcher/options.h"

namespace dtrain::launcher {
namespace po = boost::program_options;

int validate_command(const Args& args) {
  std::string job_file;
  po::options_description desc(
      "Usage: dtrain validate JOB_FILE\n\n"
      "Checks a job file and prints the TF_CONFIG each task would get.\n\n"
      "Options");
  desc.add_options()("help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {{"job-file", &job_file}}, "validate");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  common::JobSpec spec = common::load_job_spec(job_file);
  common::ClusterSpec cluster = common::resolve_cluster(spec);
  std::cout << fmt::format("{}: OK: job \"{}\", {} training task(s), chief {}, run directory {}\n",
                           job_file, spec.job, cluster.ring_size(), cluster.chief().text(),
                           spec.run_dir);
  if (spec.auto_workers > 0) {
    std::cout << "# \"workers\": ports below were free just now; `dtrain launch` picks its own\n";
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
  common::ClusterSpec cluster = common::resolve_cluster(spec);
  common::TaskId task = common::parse_task_id(task_text);
  if (!cluster.has(task)) {
    throw common::ConfigError(fmt::format("--task {}: {} has no such task (it has {} {} task(s))",
                                          task_text, job_file, cluster.count(task.type),
                                          task.type));
  }
  std::cout << common::format_tf_config(cluster, task) << "\n";
  return 0;
}

}  // namespace dtrain::launcher
