// `dtrain generate RUN_DIR|JOB_FILE`: text sampled from a run's final language model on this
// machine's CPU (worker/train/generate.h does the work; this reads the command line).
#include <boost/program_options.hpp>
#include <iostream>

#include "common/errors.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/options.h"
#include "launcher/control/run_lookup.h"
#include "worker/train/generate.h"

namespace dtrain::launcher {
namespace po = boost::program_options;

int generate_command(const Args& args) {
  std::string target;
  train::GenerateOptions options;
  int64_t seed = static_cast<int64_t>(options.seed);
  po::options_description desc(
      "Usage: dtrain generate RUN_DIR|JOB_FILE [--prompt TEXT] [--tokens N] [--temperature T]\n"
      "                       [--top-k K] [--seed S]\n\n"
      "Samples text from a run's final language model (a model trained on a \"text\" or\n"
      "\"tokens\" source), on this machine's CPU, and prints the prompt and what follows it.\n"
      "The same seed prints the same text.\n\nOptions");
  desc.add_options()("prompt", po::value(&options.prompt),
                     "the text to continue (default: a newline); a tokens model's: its ids")(
      "tokens", po::value(&options.tokens)->default_value(options.tokens), "tokens to sample")(
      "temperature", po::value(&options.temperature)->default_value(options.temperature),
      "divides the logits: below 1 sharper, above 1 flatter")(
      "top-k", po::value(&options.top_k)->default_value(options.top_k),
      "draw from the K likeliest tokens only (0: all)")(
      "seed", po::value(&seed)->default_value(seed), "the sampler's seed")("help,h",
                                                                           "show this help");
  po::variables_map vm = parse_options(args, desc, {{"run", &target}}, "generate");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (target.empty()) throw common::ConfigError("generate: name a run directory or a job file");
  if (seed < 0) throw common::ConfigError("--seed: expected 0 or more");
  options.seed = static_cast<uint64_t>(seed);
  options.run_dir = resolve_run_dir(target, "generate");
  train::generate_text(options, [](const std::string& text) { std::cout << text << std::flush; });
  std::cout << "\n";
  return 0;
}

}  // namespace dtrain::launcher
