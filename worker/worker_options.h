// Command line of dtrain-worker. Parsing only; what the options mean is main()'s business.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

struct WorkerOptions {
  std::string config_path;       ///< --config: a job file (its `train`) or a bare train object
  std::string run_dir;           ///< --run-dir, else DTRAIN_RUN_DIR, else runs/<job>
  bool print_gpu = false;        ///< --gpu-info: print what the CUDA side sees and exit
  bool print_gpu_count = false;  ///< --gpu-count: print the number of usable GPUs and exit
  /// --progress-interval: seconds between progress lines inside an epoch when stdout is not a
  /// terminal (0: one line per epoch).
  double progress_line_seconds = 5.0;
  bool help = false;
  bool version = false;
};

/// Throws ConfigError for unknown options or missing values.
WorkerOptions parse_worker_options(const std::vector<std::string>& args);

/// --help text.
std::string worker_usage();

}  // namespace dtrain::train
