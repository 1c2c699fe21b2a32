// `dtrain generate RUN_DIR|JOB_FILE`: text sampled from a run's final language model on this
// machine's CPU. This reads the command line and finds the run; dtrain-worker does the work
// (launcher/cli/in_worker.h, worker/train/generate.h).
#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <iostream>

#include "common/errors.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/in_worker.h"
#include "launcher/cli/options.h"
#include "launcher/control/run_lookup.h"

namespace dtrain::launcher {
namespace po = boost::program_options;

int generate_command(const Args& args) {
  std::string target;
  // The sampler's defaults: nanoGPT's sample.py's prompt (a newline) and seed, every token.
  std::string prompt = "\n";
  int tokens = 500;
  double temperature = 1.0;
  int top_k = 0;
  int64_t seed = 1337;
  po::options_description desc(
      "Usage: dtrain generate RUN_DIR|JOB_FILE [--prompt TEXT] [--tokens N] [--temperature T]\n"
      "                       [--top-k K] [--seed S]\n\n"
      "Samples text from a run's final language model (a model trained on a \"text\" or\n"
      "\"tokens\" source), on this machine's CPU, and prints the prompt and what follows it.\n"
      "The same seed prints the same text.\n\nOptions");
  desc.add_options()("prompt", po::value(&prompt),
                     "the text to continue (default: a newline); a tokens model's: its ids")(
      "tokens", po::value(&tokens)->default_value(tokens), "tokens to sample")(
      "temperature", po::value(&temperature)->default_value(temperature),
      "divides the logits: below 1 sharper, above 1 flatter")(
      "top-k", po::value(&top_k)->default_value(top_k),
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
  exec_in_worker({"generate", "--run-dir", resolve_run_dir(target, "generate"), "--prompt", prompt,
                  "--tokens", fmt::format("{}", tokens), "--temperature",
                  fmt::format("{}", temperature), "--top-k", fmt::format("{}", top_k), "--seed",
                  fmt::format("{}", seed)});
}

}  // namespace dtrain::launcher
