// See train_config.h.
#include "worker/spec/train_config.h"

#include <fmt/format.h>

#include <filesystem>
#include <string_view>

#include "common/cpu_isa.h"
#include "common/errors.h"
#include "common/json.h"
#include "worker/spec/keras_model.h"

namespace dtrain::train {
namespace {

std::string one_of(const common::JsonNode& node, std::initializer_list<const char*> allowed) {
  std::string value = node.as_string();
  for (const char* a : allowed) {
    if (value == a) return value;
  }
  std::string names;
  for (const char* a : allowed) names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", a);
  node.fail(fmt::format("expected one of {}, found \"{}\"", names, value));
}

// What the run directory holds besides the backup folder (common/run_dir.h and the files the
// launcher, trainer and evaluator add): a backup folder there would mix checkpoints into it.
constexpr std::string_view kRunDirEntries[] = {
    "spec.json",    "state.json",       "events.jsonl", "logs",          "model",
    "tensorboard",  "metrics.jsonl",    "eval.jsonl",   "launcher.lock", "launcher.pid",
    "launcher.log", "launcher.reserve", "control.sock"};

// A folder inside the run directory that the chief fills (backup.dir, tensorboard.log_dir): a
// relative path of plain names, with no "." or "..", whose first name is not one of the run's own
// entries, except `own`, the entry this key's default lives in.
std::string run_dir_folder(const common::JsonNode& node, std::string_view own = {}) {
  std::string dir = node.as_nonempty_string();
  auto refuse = [&](const std::string& why) {
    node.fail(fmt::format("{} is not a folder inside the run directory: {}", node.describe(), why));
  };
  if (dir.front() == '/') refuse("it is an absolute path; give one relative to the run directory");
  for (char c : dir) {
    if (static_cast<unsigned char>(c) < 0x20) refuse("it has a control character");
  }
  std::filesystem::path path(dir);
  for (const std::filesystem::path& part : path) {
    if (part == "." || part == "..") refuse("\".\" and \"..\" are not allowed in it");
  }
  std::string first = path.begin()->string();
  for (std::string_view entry : kRunDirEntries) {
    if (first == entry && first != own)
      refuse(fmt::format("\"{}\" is the run directory's own", entry));
  }
  return dir;
}

// True when one relative folder is the other or lies inside it ("a/b" and "a/b/c").
bool nested(const std::string& a, const std::string& b) {
  std::filesystem::path pa = std::filesystem::path(a).lexically_normal();
  std::filesystem::path pb = std::filesystem::path(b).lexically_normal();
  auto ia = pa.begin(), ib = pb.begin();
  for (; ia != pa.end() && ib != pb.end(); ++ia, ++ib) {
    if (ia->empty() || ib->empty()) break;  // a trailing separator
    if (*ia != *ib) return false;
  }
  return true;
}

BackupSpec parse_backup(const common::JsonNode& node) {
  node.check_keys({"dir", "save_freq", "keep", "delete_on_success"});
  BackupSpec b;
  if (auto n = node.find("dir")) b.dir = run_dir_folder(*n);
  if (auto n = node.find("save_freq")) {
    if (n->is_string()) {
      if (n->as_string() != "epoch")
        n->fail(fmt::format("expected \"epoch\" or a number of steps, found {}", n->describe()));
    } else {
      b.save_every_steps = n->as_int(1, int64_t{1} << 40);
    }
  }
  if (auto n = node.find("keep")) b.keep = static_cast<int>(n->as_int(1, 1000));
  if (auto n = node.find("delete_on_success")) b.delete_on_success = n->as_bool();
  return b;
}

// true, false, or {"update_freq": "epoch" | "batch" | N, "log_dir": "tensorboard"}.
TensorBoardSpec parse_tensorboard(const common::JsonNode& node, const std::string& backup_dir) {
  TensorBoardSpec t;
  if (!node.is_object()) {
    try {
      t.enabled = node.as_bool();
    } catch (const common::ConfigError&) {
      node.fail(fmt::format("expected true, false or an object, found {}", node.describe()));
    }
    return t;
  }
  node.check_keys({"update_freq", "log_dir"});
  if (auto n = node.find("update_freq")) {
    if (!n->is_string()) {
      t.update_every_steps = n->as_int(1, int64_t{1} << 40);
    } else if (one_of(*n, {"epoch", "batch"}) == "batch") {
      t.update_every_steps = 1;
    }
  }
  if (auto n = node.find("log_dir")) t.log_dir = run_dir_folder(*n, "tensorboard");
  if (nested(t.log_dir, backup_dir)) {
    (node.find("log_dir") ? node.at("log_dir") : node)
        .fail(fmt::format("\"{}\" and backup.dir \"{}\" overlap: give each its own folder",
                          t.log_dir, backup_dir));
  }
  return t;
}

// Keras's loss names (and its short ones for the errors) to the loss.
nn::Loss loss_named(const common::JsonNode& node) {
  const std::string name = one_of(
      node, {"sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy",
             "mean_squared_error", "mse", "mean_absolute_error", "mae"});
  if (name == "categorical_crossentropy") return nn::Loss::kCategorical;
  if (name == "binary_crossentropy") return nn::Loss::kBinary;
  if (name == "mean_squared_error" || name == "mse") return nn::Loss::kMeanSquared;
  if (name == "mean_absolute_error" || name == "mae") return nn::Loss::kMeanAbsolute;
  return nn::Loss::kSparseCategorical;
}

bool regression(nn::Loss loss) {
  return loss == nn::Loss::kMeanSquared || loss == nn::Loss::kMeanAbsolute;
}

// {"type": <a Keras loss>, "from_logits": ..., "label_smoothing": ...}, or Keras's shorthand, the
// name alone, which means what Keras's string does: from_logits false.
void parse_loss(const common::JsonNode& node, TrainConfig& c) {
  if (node.is_string()) {
    c.loss = loss_named(node);
    c.from_logits = false;
    return;
  }
  if (!node.is_object())
    node.fail(fmt::format("expected a loss name or object, found {}", node.describe()));
  c.loss = loss_named(node.at("type"));
  if (regression(c.loss)) {
    node.check_keys({"type"});
  } else {
    node.check_keys({"type", "from_logits", "label_smoothing"});
  }
  if (auto n = node.find("from_logits")) c.from_logits = n->as_bool();
  if (auto n = node.find("label_smoothing"))
    c.label_smoothing = static_cast<float>(n->as_number(0.0, 1.0));
}

// The last layer's activation against the loss: what Keras would compute silently wrong is exit 2
// naming train.loss.
void check_loss_against_model(const common::JsonNode& root, const TrainConfig& c) {
  const common::JsonNode& at = root.find("loss") ? root.at("loss") : root;
  const nn::Activation last = c.model.nodes.back().config->activation();
  const bool softmax = last == nn::Activation::kSoftmax, sigmoid = last == nn::Activation::kSigmoid;
  const nn::Dims out = c.model.output_dims();
  if (c.loss != nn::Loss::kSparseCategorical && out.sequence) {
    at.fail(
        "a model of a sequence's positions trains with sparse_categorical_crossentropy (each "
        "position's next token)");
  }
  switch (c.loss) {
    case nn::Loss::kSparseCategorical:
    case nn::Loss::kCategorical:
      if (softmax == c.from_logits) {
        at.fail(softmax ? "from_logits is true but the last layer already applies softmax"
                        : "from_logits is false but the last layer has no softmax activation: "
                          "set \"from_logits\": true or add \"activation\": \"softmax\"");
      }
      break;
    case nn::Loss::kBinary:
      if (softmax) {
        at.fail(
            "binary_crossentropy scores each output on its own, and the last layer's softmax "
            "ties them together: use \"activation\": \"sigmoid\" (or none with "
            "\"from_logits\": true)");
      }
      if (sigmoid == c.from_logits) {
        at.fail(sigmoid ? "from_logits is true but the last layer already applies sigmoid"
                        : "from_logits is false but the last layer has no sigmoid activation: "
                          "set \"from_logits\": true or add \"activation\": \"sigmoid\"");
      }
      break;
    case nn::Loss::kMeanSquared:
    case nn::Loss::kMeanAbsolute:
      if (softmax) {
        at.fail(
            "a regression loss compares the last layer's values with the labels, and its "
            "softmax makes them class probabilities: remove the softmax (regression) or use "
            "a cross-entropy (classification)");
      }
      break;
  }
}

// train.metrics: Keras's names. The companion (accuracy for the cross-entropies) is always
// logged; what Keras would compute and dtrain cannot is exit 2 naming the metric.
void parse_metrics(const common::JsonNode& node, TrainConfig& c) {
  if (!node.is_array())
    node.fail(fmt::format("expected a list of metric names, found {}", node.describe()));
  const bool classes = !regression(c.loss);
  const bool sparse = c.loss == nn::Loss::kSparseCategorical;
  for (const common::JsonNode& item : node.as_array()) {
    MetricSpec m;
    if (item.is_object()) {
      item.check_keys({"type", "k"});
      if (auto k = item.find("k")) m.k = static_cast<int>(k->as_int(1, 1 << 20));
    }
    const common::JsonNode name_node = item.is_object() ? item.at("type") : item;
    m.name = name_node.as_nonempty_string();
    const std::string& n = m.name;
    auto refuse = [&](const std::string& why) {
      name_node.fail(fmt::format("\"{}\": {}", n, why));
    };
    const bool top_k =
        n == "top_k_categorical_accuracy" || n == "sparse_top_k_categorical_accuracy";
    if (auto k = item.is_object() ? item.find("k") : std::nullopt; k && !top_k)
      k->fail("only a top-k accuracy has k");
    if (n == "accuracy" || n == "acc" || n == "sparse_categorical_accuracy" ||
        n == "categorical_accuracy" || n == "binary_accuracy") {
      if (!classes) refuse("an accuracy needs a classification loss; this is a regression");
      if (n == "sparse_categorical_accuracy" && !sparse)
        refuse("compares class indices; this loss takes one-hot or 0/1 labels: use \"accuracy\"");
      if (n == "categorical_accuracy" && c.loss != nn::Loss::kCategorical)
        refuse("compares one-hot labels; use \"accuracy\", which fits this loss");
      if (n == "binary_accuracy" && c.loss != nn::Loss::kBinary)
        refuse("scores 0/1 labels; use \"accuracy\", which fits this loss");
      continue;  // the companion: logged as "accuracy"
    }
    if (top_k) {
      if (c.loss == nn::Loss::kBinary || !classes)
        refuse(
            "needs a categorical loss (sparse_categorical_crossentropy or "
            "categorical_crossentropy)");
      if ((n[0] == 's') != sparse)
        refuse(sparse ? "compares one-hot labels; this loss takes class indices: use "
                        "sparse_top_k_categorical_accuracy"
                      : "compares class indices; this loss takes one-hot labels: use "
                        "top_k_categorical_accuracy");
      m.kind = MetricSpec::Kind::kTopK;
    } else if (n == "mae" || n == "mean_absolute_error" || n == "mse" ||
               n == "mean_squared_error") {
      if (classes) refuse("measures a regression; this loss is a classification's");
      const bool absolute = n == "mae" || n == "mean_absolute_error";
      if (absolute == (c.companion == "mae")) continue;  // the companion
      m.kind = absolute ? MetricSpec::Kind::kMeanAbsolute : MetricSpec::Kind::kMeanSquared;
    } else if (n == "auc" || n == "AUC") {
      refuse("not computed by dtrain yet (it needs the whole validation set's scores)");
    } else {
      refuse(
          "unknown metric (expected accuracy, binary_accuracy, categorical_accuracy, "
          "sparse_categorical_accuracy, top_k_categorical_accuracy, "
          "sparse_top_k_categorical_accuracy, mae or mse)");
    }
    for (const MetricSpec& given : c.metrics)
      if (given.name == n) refuse("given twice");
    c.metrics.push_back(m);
  }
}

// dtype_policy (Keras's policy names) and allow_tf32 into the backend's math mode, and the loss
// scale that goes with it (docs/design.md#loss-scaling).
void parse_math(const common::JsonNode& root, TrainConfig& c) {
  std::string policy = "float32";
  if (auto n = root.find("dtype_policy"))
    policy = one_of(*n, {"float32", "mixed_bfloat16", "mixed_float16"});
  bool tf32 = false;
  if (auto n = root.find("allow_tf32")) tf32 = n->as_bool();
  if (auto n = root.find("dtype_policy_fallback"))
    c.dtype_policy_fallback = one_of(*n, {"none", "float32"}) == "float32";
  c.math = policy == "mixed_bfloat16"  ? nn::MathMode::kBfloat16
           : policy == "mixed_float16" ? nn::MathMode::kFloat16
           : tf32                      ? nn::MathMode::kTf32
                                       : nn::MathMode::kFloat32;
  if (auto n = root.find("loss_scale")) {
    c.loss_scale = parse_loss_scale(*n);
  } else if (c.math == nn::MathMode::kFloat16) {  // Keras wraps the optimizer in a dynamic one
    c.loss_scale.enabled = true;
  }
}

// train.model: dtrain's graph, or {"keras": FILE}, a Keras model file translated into one
// (keras_model.h; FILE relative to the working directory, as data paths are).
void parse_model(const common::JsonNode& node, TrainConfig& c) {
  if (!node.is_object() || !node.find("keras")) {
    c.model = nn::parse_model_spec(node);
    c.model_json = nn::model_json(node, c.model);
    return;
  }
  node.check_keys({"keras"});
  common::JsonNode file = node.at("keras");
  std::string path = file.as_nonempty_string();
  try {
    KerasModel keras = read_keras_model(path);
    c.model = std::move(keras.spec);
    c.model_json = std::move(keras.model_json);
    c.keras_config = std::move(keras.keras_config);
  } catch (const common::ConfigError& e) {
    file.fail(e.what());
  }
}

void parse_fields(const common::JsonNode& root, TrainConfig& c) {
  root.check_keys({"model",        "loss",
                   "metrics",      "optimizer",
                   "data",         "per_worker_batch_size",
                   "epochs",       "steps_per_epoch",
                   "validation",   "seed",
                   "device",       "communication",
                   "overlap",      "cuda_graphs",
                   "dtype_policy", "dtype_policy_fallback",
                   "allow_tf32",   "loss_scale",
                   "backup",       "tensorboard",
                   "callbacks",    "ledger"});
  parse_model(root.at("model"), c);
  if (auto n = root.find("loss")) parse_loss(*n, c);
  check_loss_against_model(root, c);
  c.companion = c.loss == nn::Loss::kMeanSquared    ? "mae"
                : c.loss == nn::Loss::kMeanAbsolute ? "mse"
                                                    : "accuracy";
  if (auto n = root.find("metrics")) parse_metrics(*n, c);
  if (auto n = root.find("optimizer")) c.optimizer = parse_optimizer_spec(*n);
  if (auto n = root.find("data")) c.data = data::parse_data_config(*n);
  c.data.targets = c.loss == nn::Loss::kSparseCategorical ? ""
                   : c.loss == nn::Loss::kCategorical     ? "one_hot"
                   : c.loss == nn::Loss::kBinary          ? "binary"
                                                          : "values";
  if (auto n = root.find("per_worker_batch_size"))
    c.per_worker_batch_size = static_cast<int>(n->as_int(1, 1 << 20));
  if (auto n = root.find("epochs")) c.epochs = static_cast<int>(n->as_int(1, 1 << 20));
  if (auto n = root.find("steps_per_epoch"); n && !n->is_null())
    c.steps_per_epoch = n->as_int(1, int64_t{1} << 40);
  if (auto n = root.find("validation")) c.validation = n->as_bool();
  // As Keras's fit(validation_split=...): the held-out part is scored unless told otherwise.
  if (c.data.validation_split > 0 && !root.find("validation")) c.validation = true;
  if (auto n = root.find("seed")) c.seed = static_cast<uint64_t>(n->as_int(0, int64_t{1} << 53));
  if (auto n = root.find("device")) {
    std::string device = one_of(*n, {"auto", "cpu", "cuda"});
    c.device = device == "cpu"    ? DeviceChoice::kCpu
               : device == "cuda" ? DeviceChoice::kCuda
                                  : DeviceChoice::kAuto;
  }
  if (auto n = root.find("communication"))
    c.communication = comm::parse_communication(one_of(*n, {"auto", "ring", "shm", "nccl"}));
  if (auto n = root.find("overlap")) c.overlap = n->as_bool();
  if (auto n = root.find("cuda_graphs")) c.cuda_graphs = n->as_bool();
  if (auto n = root.find("ledger")) c.ledger = n->as_bool();
  parse_math(root, c);
  if (auto n = root.find("backup")) c.backup = parse_backup(*n);
  if (auto n = root.find("tensorboard")) c.tensorboard = parse_tensorboard(*n, c.backup.dir);
  if (auto n = root.find("callbacks")) {
    c.callbacks = parse_callbacks(*n, c.validation, logged_metrics(c));
    if (c.callbacks.reduce_lr && !c.optimizer.learning_rate.constant()) {
      n->fail(fmt::format(
          "ReduceLROnPlateau needs a constant learning rate, and train.optimizer.learning_rate "
          "is a {} schedule (Keras refuses it too)",
          c.optimizer.learning_rate.type));
    }
  }
}

}  // namespace

TrainConfig parse_train_config(std::string_view json, const std::string& source) {
  TrainConfig config;
  try {
    common::JsonDocument doc = common::JsonDocument::parse(json, source);
    common::JsonNode root = doc.root();
    if (!root.is_object())
      root.fail(fmt::format("expected the train object, found {}", root.describe()));
    parse_fields(root, config);
  } catch (const common::ConfigError& e) {
    std::string message = e.what();
    if (message.rfind(source + ":", 0) == 0) throw;
    const std::string top = "top level: ";
    if (message.rfind(top, 0) == 0)
      throw common::ConfigError(fmt::format("{}: train: {}", source, message.substr(top.size())));
    throw common::ConfigError(fmt::format("{}: train.{}", source, message));
  }
  return config;
}

std::string dtype_policy_name(const TrainConfig& config) {
  return config.math == nn::MathMode::kTf32 ? "float32" : nn::math_mode_name(config.math);
}

std::vector<std::string> logged_metrics(const TrainConfig& config) {
  std::vector<std::string> names = {"loss", config.companion};
  for (const MetricSpec& m : config.metrics) names.push_back(m.name);
  if (config.validation) {
    const size_t trained = names.size();
    for (size_t i = 0; i < trained; ++i) names.push_back("val_" + names[i]);
  }
  return names;
}

std::string cpu_policy_lack(nn::MathMode math) {
  return math == nn::MathMode::kBfloat16
             ? fmt::format(
                   "this CPU has no bf16 products (oneDNN dispatches to {}; bf16 needs "
                   "AVX512_BF16 or AMX)",
                   common::dispatch_cpu_isa())
             : std::string("oneDNN has no float16 products on the CPU (it is a GPU policy)");
}

common::ConfigError cpu_policy_error(nn::MathMode math, const std::string& source) {
  return common::ConfigError(
      fmt::format("{}: train.dtype_policy: \"{}\": {}: set \"dtype_policy\": \"float32\", or "
                  "\"dtype_policy_fallback\": \"float32\" to train in float32 on such CPUs",
                  source, nn::math_mode_name(math), cpu_policy_lack(math)));
}

}  // namespace dtrain::train
