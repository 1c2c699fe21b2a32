// `dtrain evaluate RUN_DIR|JOB_FILE` and `dtrain predict RUN_DIR|JOB_FILE`: a run's final model on
// this machine's CPU. This reads the command line and finds the run; dtrain-worker does the work
// (launcher/cli/in_worker.h, worker/train/inference.h).
#include <boost/program_options.hpp>
#include <iostream>

#include "common/errors.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/in_worker.h"
#include "launcher/cli/options.h"
#include "launcher/control/run_lookup.h"

namespace dtrain::launcher {
namespace po = boost::program_options;

int evaluate_command(const Args& args) {
  std::string target;
  std::string data, labels;
  po::options_description desc(
      "Usage: dtrain evaluate RUN_DIR|JOB_FILE [--data PATH [--labels FILE]] [--json]\n\n"
      "Scores a run's final model on this machine's CPU, as Keras's model.evaluate: the loss and\n"
      "metrics the run's validation prints, on the run's own validation data (the figures of its\n"
      "last epoch) or on PATH: an .npz archive (its x_test and y_test, or x and y), a folder of\n"
      "class folders of images, a folder holding IDX files (t10k-*), or an .npy or IDX images\n"
      "file with its labels in --labels.\n\nOptions");
  desc.add_options()("data", po::value(&data),
                     "what to evaluate on (default: the run's "
                     "validation data)")("labels", po::value(&labels),
                                         "the labels of an .npy or IDX --data file")(
      "json", "print one JSON object")("help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {{"run", &target}}, "evaluate");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (target.empty()) throw common::ConfigError("evaluate: name a run directory or a job file");
  std::vector<std::string> run = {"evaluate", "--run-dir", resolve_run_dir(target, "evaluate")};
  if (!data.empty()) run.insert(run.end(), {"--data", data});
  if (!labels.empty()) run.insert(run.end(), {"--labels", labels});
  if (vm.count("json")) run.push_back("--json");
  exec_in_worker(run);
}

int predict_command(const Args& args) {
  std::string target;
  std::string input, output;
  po::options_description desc(
      "Usage: dtrain predict RUN_DIR|JOB_FILE --input PATH --output OUT.npy|OUT.csv\n\n"
      "Runs a run's final model on inputs, on this machine's CPU, as Keras's model.predict, and\n"
      "writes what the model outputs: probabilities where its last layer has a softmax, else its\n"
      "values (logits for \"from_logits\": true). PATH is an .npy of inputs ((N, H, W),\n"
      "(N, H, W, C), or (N, F) for input_shape [F]), an .npz (x_test, x or its only member), an\n"
      "IDX images file, a PNG or JPEG file, or a folder of them (every image in it, sorted by\n"
      "path). OUT.npy holds a float32 array (N, outputs); OUT.csv a header, then a line per\n"
      "input: its file or index, the predicted class (its name where the run recorded class\n"
      "names) and each output.\n\nOptions");
  desc.add_options()("input", po::value(&input), "the inputs")(
      "output", po::value(&output), "where to write the outputs (.npy or .csv)")("help,h",
                                                                                 "show this help");
  po::variables_map vm = parse_options(args, desc, {{"run", &target}}, "predict");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (target.empty()) throw common::ConfigError("predict: name a run directory or a job file");
  if (input.empty()) throw common::ConfigError("predict: --input is required");
  if (output.empty()) throw common::ConfigError("predict: --output is required");
  exec_in_worker({"predict", "--run-dir", resolve_run_dir(target, "predict"), "--input", input,
                  "--output", output});
}

}  // namespace dtrain::launcher
