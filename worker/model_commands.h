// What `dtrain evaluate`, `dtrain predict`, `dtrain generate` and `dtrain validate`'s look at the
// data run in dtrain-worker, so that the launcher links no model, backend or data reader
// (docs/design.md#one-reading-of-a-job): the launcher reads the user's command line, finds the
// run, and executes `dtrain-worker <command> ...` with the options spelled out; this runs it and
// prints what the launcher used to print. Not for people: the launcher's commands are the
// interface (docs/cli.md), and these arguments are theirs to change.
//   dtrain-worker evaluate --run-dir DIR [--data PATH] [--labels FILE] [--json]
//   dtrain-worker predict --run-dir DIR --input PATH --output FILE
//   dtrain-worker generate --run-dir DIR --prompt TEXT --tokens N --temperature T --top-k K
//                          --seed S
//   dtrain-worker check-data --config JOB_FILE
#pragma once

#include <string>
#include <vector>

namespace dtrain::train {

/// True when args (dtrain-worker's, after the program name) start with one of the commands above.
bool is_model_command(const std::vector<std::string>& args);

/// Runs the command args name; what it prints goes to stdout, and its errors are thrown as the
/// launcher's command would have thrown them (ConfigError: exit 2). Returns the exit code.
int run_model_command(const std::vector<std::string>& args);

}  // namespace dtrain::train
