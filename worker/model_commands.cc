// See model_commands.h. Each command takes `--key value` options (and evaluate's `--json`), all
// spelled out by the launcher, which has checked the user's command line already.
#include "worker/model_commands.h"

#include <fmt/format.h>

#include <charconv>
#include <iostream>
#include <map>
#include <set>

#include "common/errors.h"
#include "common/job_spec.h"
#include "common/json.h"
#include "worker/data/dataset.h"
#include "worker/data/image_folder.h"
#include "worker/spec/train_config.h"
#include "worker/train/generate.h"
#include "worker/train/inference.h"

namespace dtrain::train {
namespace {

// The options after the command: "--key value" for the keys allowed, "--flag" for the flags.
struct CommandArgs {
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  std::string value(const std::string& key) const {
    auto it = values.find(key);
    return it == values.end() ? "" : it->second;
  }
};

CommandArgs parse_command_args(const std::vector<std::string>& args,
                               const std::set<std::string>& keys,
                               const std::set<std::string>& flags) {
  CommandArgs out;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string name = args[i].rfind("--", 0) == 0 ? args[i].substr(2) : "";
    if (flags.count(name)) {
      out.flags.insert(name);
    } else if (keys.count(name) && i + 1 < args.size()) {
      out.values[name] = args[++i];
    } else {
      throw common::ConfigError(
          fmt::format("dtrain-worker {}: unexpected argument '{}'", args[0], args[i]));
    }
  }
  return out;
}

template <typename T>
T number(const CommandArgs& a, const std::string& key, T fallback) {
  const std::string text = a.value(key);
  if (text.empty()) return fallback;
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw common::ConfigError(fmt::format("--{}: '{}' is not a number", key, text));
  return value;
}

int evaluate(const CommandArgs& a) {
  EvaluateOptions options;
  options.run_dir = a.value("run-dir");
  options.data = a.value("data");
  options.labels = a.value("labels");
  Evaluation result = evaluate_run(options);
  if (a.flags.count("json")) {
    common::JsonWriter out;
    out.begin_object().key("data").value(result.data).key("examples").value(result.examples);
    out.key("loss").value(result.loss);
    for (const auto& [name, value] : result.metrics) out.key(name).value(value);
    std::cout << out.end_object().str() << "\n";
    return 0;
  }
  std::string line = fmt::format("{} examples: loss: {:.4f}", result.examples, result.loss);
  for (const auto& [name, value] : result.metrics)
    line += fmt::format(" - {}: {:.4f}", name, value);
  std::cout << result.data << "\n" << line << "\n";
  return 0;
}

int predict(const CommandArgs& a) {
  PredictOptions options;
  options.run_dir = a.value("run-dir");
  options.input = a.value("input");
  options.output = a.value("output");
  Prediction result = predict_run(options);
  std::cout << fmt::format("{}: {} examples x {} outputs\n", options.output, result.examples,
                           result.outputs);
  return 0;
}

int generate(const CommandArgs& a) {
  GenerateOptions options;
  options.run_dir = a.value("run-dir");
  if (a.values.count("prompt")) options.prompt = a.value("prompt");
  options.tokens = number(a, "tokens", options.tokens);
  options.temperature = number(a, "temperature", options.temperature);
  options.top_k = number(a, "top-k", options.top_k);
  options.seed = number(a, "seed", options.seed);
  generate_text(options, [](const std::string& text) { std::cout << text << std::flush; });
  std::cout << "\n";
  return 0;
}

// `dtrain validate`'s look at the data of a job that trains on this machine: the readers open
// it as the workers will (an image folder is scanned, not decoded), its shape is checked
// against the model, its labels against the model's outputs and the loss. Prints what it found;
// ConfigError "<source>: train.data: <the reader's words>" for what a worker would refuse.
int check_data(const CommandArgs& a) {
  const common::JobSpec spec = common::load_job_spec(a.value("config"));
  if (!spec.train_json) return 0;
  const TrainConfig config = parse_train_config(*spec.train_json, spec.source);
  const data::DataConfig& d = config.data;
  try {
    if (d.source == "directory") {  // decoding every image is the workers' start-up, not this
      data::ImageFolder folder = data::scan_image_folder(d.train_dir, d.class_names);
      std::string line = fmt::format("# data: {} images in {} class folders of {}",
                                     folder.files.size(), folder.class_names.size(), d.train_dir);
      if (!d.test_dir.empty() && config.validation) {
        data::ImageFolder test = data::scan_image_folder(d.test_dir, folder.class_names);
        line += fmt::format(", {} in {}", test.files.size(), d.test_dir);
      }
      std::cout << line << " (scanned, not decoded)\n";
      return 0;
    }
    auto [train, test] = data::load_data(d, config.model.data_shape(), config.validation);
    const int units = config.model.units();
    data::check_labels_below(train, units);
    data::check_labels_below(test, units);
    std::string what =
        train.is_text() ? fmt::format("{} tokens", train.token_count)
        : train.target_width > 0
            ? fmt::format("{} examples, {} target value(s) each", train.count, train.target_width)
            : fmt::format("{} examples of {} classes", train.count, train.classes);
    std::string line = fmt::format("# data: {} ({}) to train", what, d.source);
    if (config.validation)
      line += fmt::format(", {} to validate", test.is_text() ? test.token_count : test.count);
    std::cout << line << "\n";
    return 0;
  } catch (const common::ConfigError& e) {
    throw common::ConfigError(fmt::format("{}: train.data: {}", spec.source, e.what()));
  }
}

struct ModelCommand {
  const char* name;
  std::set<std::string> keys;
  std::set<std::string> flags;
  int (*run)(const CommandArgs& args);
};

const std::vector<ModelCommand>& model_commands() {
  static const std::vector<ModelCommand> commands = {
      {"evaluate", {"run-dir", "data", "labels"}, {"json"}, evaluate},
      {"predict", {"run-dir", "input", "output"}, {}, predict},
      {"generate", {"run-dir", "prompt", "tokens", "temperature", "top-k", "seed"}, {}, generate},
      {"check-data", {"config"}, {}, check_data},
  };
  return commands;
}

}  // namespace

bool is_model_command(const std::vector<std::string>& args) {
  if (args.empty()) return false;
  for (const ModelCommand& command : model_commands())
    if (args[0] == command.name) return true;
  return false;
}

int run_model_command(const std::vector<std::string>& args) {
  for (const ModelCommand& command : model_commands()) {
    if (args.at(0) == command.name)
      return command.run(parse_command_args(args, command.keys, command.flags));
  }
  throw common::ConfigError(fmt::format("dtrain-worker: no command '{}'", args.at(0)));
}

}  // namespace dtrain::train
