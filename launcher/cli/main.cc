// dtrain: the launcher and its client commands. main() only picks the subcommand.
#include <iostream>
#include <string>

#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/version.h"
#include "launcher/cli/commands.h"

namespace dtrain::launcher {

const std::vector<Command>& all_commands() {
  static const std::vector<Command> commands = {
      {"launch", "start a job's workers, watch them, restart the group on failure", launch_command},
      {"logs", "print or follow the workers' logs of a run", logs_command},
      {"status", "show a run's state and each worker's progress", status_command},
      {"stop", "stop a running launcher (workers save a checkpoint; --now kills them)",
       stop_command},
      {"evaluate", "score a run's final model on its validation data or other data",
       evaluate_command},
      {"predict", "write a run's final model's outputs for inputs (.npy or .csv)", predict_command},
      {"generate", "sample text from a run's final language model", generate_command},
      {"validate", "check a job file and print each task's TF_CONFIG", validate_command},
      {"tf-config", "print the TF_CONFIG of one task of a job file", tf_config_command},
      {"slurm-script", "print an sbatch script that runs a \"cluster\": \"slurm\" job",
       slurm_script_command},
      {"completion", "print a shell completion script (dtrain completion bash)",
       completion_command},
      {"agent", "run one worker for a launcher on another host (over ssh, or as a Slurm step)",
       agent_command},
  };
  return commands;
}

namespace {

void print_usage() {
  std::cout << "Usage: dtrain COMMAND [ARGS...]\n\n"
               "Starts, watches and restarts groups of training workers that read TF_CONFIG.\n\n"
               "Commands:\n";
  for (const Command& c : all_commands())
    std::cout << fmt::format("  {:<12} {}\n", c.name, c.summary);
  std::cout << "\n`dtrain COMMAND --help` describes one command. `dtrain --version` prints the "
               "version.\n`source <(dtrain completion bash)` turns on tab completion.\nExit codes: "
               "0 success, 2 configuration or usage error, other non-zero: "
               "the job failed.\n";
}

int dispatch(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage();
    return args.empty() ? common::kExitConfig : common::kExitSuccess;
  }
  if (args[0] == "--version") {
    std::cout << "dtrain " << DTRAIN_VERSION << "\n";
    return common::kExitSuccess;
  }
  for (const Command& c : all_commands()) {
    if (args[0] == c.name) return c.run(Args(args.begin() + 1, args.end()));
  }
  throw common::ConfigError(fmt::format("unknown command \"{}\" (see dtrain --help)", args[0]));
}

}  // namespace
}  // namespace dtrain::launcher

int main(int argc, char** argv) {
  return dtrain::common::run_main("dtrain", [&] { return dtrain::launcher::dispatch(argc, argv); });
}
