// dtrain-worker's flags, read with Boost.Program_options.
#include "worker/worker_options.h"

#include <boost/program_options.hpp>

#include "common/errors.h"

namespace dtrain::train {
namespace po = boost::program_options;

namespace {
po::options_description describe_options(WorkerOptions& options) {
  po::options_description desc("Options");
  desc.add_options()("config", po::value(&options.config_path),
                     "job file (its \"train\" object) or a bare train object")(
      "run-dir", po::value(&options.run_dir),
      "run directory (default: $DTRAIN_RUN_DIR, else runs/<job>)")(
      "progress-interval", po::value(&options.progress_line_seconds)->value_name("SECONDS"),
      "when output is not a terminal, seconds between progress lines inside an epoch (default "
      "5; 0: one line per epoch)")(
      "gpu-count", po::bool_switch(&options.print_gpu_count),
      "print the number of GPUs this build can use (0 without CUDA), then exit")(
      "gpu-info", po::bool_switch(&options.print_gpu),
      "print what the CUDA side of this build sees, then exit")(
      "version", po::bool_switch(&options.version), "print the version")(
      "help,h", po::bool_switch(&options.help), "show this help");
  return desc;
}
}  // namespace

WorkerOptions parse_worker_options(const std::vector<std::string>& args) {
  WorkerOptions options;
  po::options_description desc = describe_options(options);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
    if (!(options.progress_line_seconds >= 0))
      throw common::ConfigError("--progress-interval: expected a number of seconds >= 0");
  } catch (const po::error& e) {
    throw common::ConfigError(fmt::format("{} (see dtrain-worker --help)", e.what()));
  }
  return options;
}

std::string worker_usage() {
  WorkerOptions unused;
  std::ostringstream out;
  out << "Usage: dtrain-worker --config FILE [--run-dir DIR]\n\n"
         "Trains the job's model as one worker of a synchronous data-parallel group. The task\n"
         "comes from TF_CONFIG (TensorFlow's format); without TF_CONFIG it trains alone.\n"
         "Normally started by `dtrain launch`, which sets TF_CONFIG and DTRAIN_* for it.\n\n"
      << describe_options(unused)
      << "\nExit codes: 0 finished, 2 configuration error, 143 preempted (checkpoint saved),\n"
         "other non-zero: failed (the launcher restarts the group).\n"
         "\nDTRAIN_CACHE_DIR: where decompressed copies of gzip data files are kept (default\n"
         "$XDG_CACHE_HOME/dtrain or ~/.cache/dtrain; \"off\": none).\n";
  return out.str();
}

}  // namespace dtrain::train
