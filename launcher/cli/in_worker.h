// The commands that run a model or read data do it in dtrain-worker, so that dtrain links no
// model, backend or data reader (docs/design.md#one-reading-of-a-job): `dtrain evaluate`,
// `predict` and `generate` read their command line and find the run here, then become
// `dtrain-worker <command> ...` (worker/model_commands.h); `dtrain validate` asks it to look at
// the data.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launcher {

/// Replaces this process with `dtrain-worker args...` (the program launches start:
/// find_worker_program), which prints and exits as the command would have. Throws IoError when
/// it cannot be executed.
[[noreturn]] void exec_in_worker(const std::vector<std::string>& args);

/// `dtrain-worker check-data --config job_file`: the line saying what the data of a job that
/// trains on this machine holds. ConfigError with the worker's words (naming job_file and
/// train.data) for data a worker would refuse; IoError when the check could not run or did not
/// end within kDataCheckSeconds.
std::string check_data_in_worker(const std::string& job_file);

/// Reading a large data set takes a while; a check stuck longer than this is stopped.
constexpr double kDataCheckSeconds = 600;

}  // namespace dtrain::launcher
