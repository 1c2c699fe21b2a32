// See callback_specs.h.
#include "worker/spec/callback_specs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "common/errors.h"

namespace dtrain::train {
namespace {

MonitorSpec parse_monitor(const common::JsonNode& node, bool validation,
                          const std::vector<std::string>& logged, const char* baseline_key) {
  MonitorSpec s;
  if (auto n = node.find("monitor")) s.monitor = n->as_string();
  const bool listed = std::find(logged.begin(), logged.end(), s.monitor) != logged.end();
  const bool validated_name =
      std::find(logged.begin(), logged.end(),
                s.monitor.substr(std::min<size_t>(4, s.monitor.size()))) != logged.end();
  if (!listed && !(s.monitor.rfind("val_", 0) == 0 && !validation && validated_name)) {
    node.at("monitor").fail(fmt::format("\"{}\" is not a metric this run logs ({})", s.monitor,
                                        fmt::join(logged, ", ")));
  }
  if (s.monitor.rfind("val_", 0) == 0 && !validation) {
    const std::string what = fmt::format(
        "\"{}\" needs validation, and train.validation is false (monitor \"loss\", or turn "
        "validation on)",
        s.monitor);
    if (auto n = node.find("monitor")) n->fail(what);
    node.fail("monitor (Keras's default) " + what);
  }
  if (auto n = node.find("min_delta")) s.min_delta = std::fabs(n->as_number(-1e300, 1e300));
  if (auto n = node.find("verbose")) n->as_int(0, 2);  // dtrain always says what it did
  std::string mode = "auto";
  if (auto n = node.find("mode")) mode = n->as_string();
  if (mode != "auto" && mode != "min" && mode != "max")
    node.at("mode").fail(fmt::format("\"{}\" is not auto, min or max", mode));
  // Keras's "auto": max for an accuracy (or acc) or auc, min for the rest.
  s.maximize = mode == "max" || (mode == "auto" && (s.monitor.find("acc") != std::string::npos ||
                                                    s.monitor.find("auc") != std::string::npos));
  if (auto n = node.find(baseline_key); n && !n->is_null())
    s.baseline = n->as_number(-1e300, 1e300);
  return s;
}

// flat: {"type": "EarlyStopping", keys...}; else Keras's config object.
EarlyStoppingSpec parse_early_stopping(const common::JsonNode& node, bool validation,
                                       const std::vector<std::string>& logged, bool flat) {
  if (flat) {
    node.check_keys({"type", "monitor", "min_delta", "patience", "verbose", "mode", "baseline",
                     "restore_best_weights", "start_from_epoch"});
  } else {
    node.check_keys({"monitor", "min_delta", "patience", "verbose", "mode", "baseline",
                     "restore_best_weights", "start_from_epoch"});
  }
  EarlyStoppingSpec s;
  s.watch = parse_monitor(node, validation, logged, "baseline");
  if (auto n = node.find("patience")) s.patience = static_cast<int>(n->as_int(0, 1 << 20));
  if (auto n = node.find("restore_best_weights")) s.restore_best_weights = n->as_bool();
  if (auto n = node.find("start_from_epoch"))
    s.start_from_epoch = static_cast<int>(n->as_int(0, 1 << 20));
  return s;
}

ModelCheckpointSpec parse_model_checkpoint(const common::JsonNode& node, bool validation,
                                           const std::vector<std::string>& logged, bool flat) {
  if (flat) {
    node.check_keys({"type", "filepath", "monitor", "verbose", "save_best_only",
                     "save_weights_only", "mode", "save_freq", "initial_value_threshold"});
  } else {
    node.check_keys({"filepath", "monitor", "verbose", "save_best_only", "save_weights_only",
                     "mode", "save_freq", "initial_value_threshold"});
  }
  if (auto n = node.find("filepath")) n->as_string();  // Keras's file; dtrain's is model/best/
  if (auto n = node.find("save_weights_only")) n->as_bool();  // weights and model.json, always
  const auto best_only = node.find("save_best_only");
  if (!best_only || !best_only->as_bool()) {
    (best_only ? *best_only : node)
        .fail(
            "ModelCheckpoint is taken with \"save_best_only\": true (RUN_DIR/model/best/); "
            "every epoch's state is train.backup's");
  }
  if (auto n = node.find("save_freq"); n && !(n->is_string() && n->as_string() == "epoch"))
    n->fail("only \"epoch\" is taken: the best is judged on the epoch's metrics");
  ModelCheckpointSpec s;
  s.watch = parse_monitor(node, validation, logged, "initial_value_threshold");
  return s;
}

ReduceLrSpec parse_reduce_lr(const common::JsonNode& node, bool validation,
                             const std::vector<std::string>& logged, bool flat) {
  if (flat) {
    node.check_keys({"type", "monitor", "factor", "patience", "verbose", "mode", "min_delta",
                     "cooldown", "min_lr"});
  } else {
    node.check_keys(
        {"monitor", "factor", "patience", "verbose", "mode", "min_delta", "cooldown", "min_lr"});
  }
  ReduceLrSpec s;
  s.watch = parse_monitor(node, validation, logged, "");
  if (!node.find("min_delta")) s.watch.min_delta = 1e-4;  // Keras's default here
  if (auto n = node.find("factor")) {
    s.factor = n->as_number(0, 1e300);
    if (!(s.factor < 1.0)) n->fail("must be below 1 (the rate is multiplied by it)");
  }
  if (auto n = node.find("patience")) s.patience = static_cast<int>(n->as_int(0, 1 << 20));
  if (auto n = node.find("cooldown")) s.cooldown = static_cast<int>(n->as_int(0, 1 << 20));
  if (auto n = node.find("min_lr")) s.min_lr = n->as_number(0, 1e300);
  return s;
}

}  // namespace

bool MonitorSpec::improves(double value, double reference) const {
  return maximize ? value - min_delta > reference : value + min_delta < reference;
}

CallbackSpecs parse_callbacks(const common::JsonNode& node, bool validation,
                              const std::vector<std::string>& logged) {
  if (!node.is_array()) node.fail(fmt::format("expected a list, found {}", node.describe()));
  CallbackSpecs specs;
  common::JsonDocument empty = common::JsonDocument::parse("{}", "callbacks");
  for (const common::JsonNode& item : node.as_array()) {
    if (!item.is_object())
      item.fail(fmt::format("expected a callback object, found {}", item.describe()));
    const bool keras = item.find("class_name").has_value();
    const std::string name = (keras ? item.at("class_name") : item.at("type")).as_string();
    std::optional<common::JsonNode> config;
    if (keras) {
      item.check_keys({"class_name", "config", "module", "registered_name"});
      config = item.find("config");
    }
    const common::JsonNode& keys = keras ? (config ? *config : empty.root()) : item;
    if (name == "EarlyStopping" || name == "early_stopping") {
      if (specs.early_stopping) item.fail("a second EarlyStopping: give one");
      specs.early_stopping = parse_early_stopping(keys, validation, logged, !keras);
    } else if (name == "ModelCheckpoint" || name == "model_checkpoint") {
      if (specs.model_checkpoint) item.fail("a second ModelCheckpoint: give one");
      specs.model_checkpoint = parse_model_checkpoint(keys, validation, logged, !keras);
    } else if (name == "ReduceLROnPlateau" || name == "reduce_lr_on_plateau") {
      if (specs.reduce_lr) item.fail("a second ReduceLROnPlateau: give one");
      specs.reduce_lr = parse_reduce_lr(keys, validation, logged, !keras);
    } else if (name == "TerminateOnNaN" || name == "terminate_on_nan") {
      // Always on: every step's loss and each checkpoint's weights are checked.
    } else {
      item.fail(fmt::format(
          "callback \"{}\" is not supported (EarlyStopping, ModelCheckpoint, ReduceLROnPlateau "
          "and TerminateOnNaN are)",
          name));
    }
  }
  return specs;
}

}  // namespace dtrain::train
