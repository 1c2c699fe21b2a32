// The subcommands of `dtrain`. Each takes the arguments after its name, prints to stdout, and
// returns an exit code; errors are thrown as common:: errors for run_main() to report.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launcher {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
};

int validate_command(const Args& args);
int tf_config_command(const Args& args);
int launch_command(const Args& args);
int logs_command(const Args& args);
int status_command(const Args& args);
int stop_command(const Args& args);
int agent_command(const Args& args);
int slurm_script_command(const Args& args);
int completion_command(const Args& args);
int generate_command(const Args& args);
int evaluate_command(const Args& args);
int predict_command(const Args& args);

/// Every subcommand, in the order `dtrain --help` lists them.
const std::vector<Command>& all_commands();

}  // namespace dtrain::launcher
