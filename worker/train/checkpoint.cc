// See checkpoint.h. Metadata values are strings (safetensors' rule); numbers are written with
// %.17g so they read back exactly.
#include "worker/train/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"

namespace dtrain::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "dtrain-checkpoint";
/// 2: the checksum covers the tensor index too (docs/design.md#checkpoint-format). Version 1 files
/// are refused: their checksum let a header point one tensor at another's bytes unnoticed.
constexpr const char* kFormatVersion = "2";
constexpr const char* kIndex = "checkpoint.json";
constexpr const char* kEpochMetrics = "epoch_metrics";  ///< optional metadata entry
constexpr const char* kDtypePolicy = "dtype_policy";    ///< optional: absent means float32
constexpr const char* kClassNames = "class_names";      ///< optional: a JSON list of strings
constexpr const char* kVocabulary = "vocabulary";       ///< optional: a text source's, as JSON
constexpr int64_t kMaxEpochs = int64_t{1} << 20;        ///< train.epochs' own limit
constexpr int64_t kMaxSteps = int64_t{1} << 50;

// Optional, together: a dynamic loss scale and its count (absent: none, the initial state).
constexpr const char* kLossScale = "loss_scale";
constexpr const char* kLossScaleGoodSteps = "loss_scale_good_steps";

std::string number(double v) {
  return fmt::format("{:.17g}", v);
}

// The class names as a JSON list (label i is element i), as checkpoints, model.safetensors and
// model.json record them.
std::string class_names_json(const std::vector<std::string>& class_names) {
  common::JsonWriter names;
  names.begin_array();
  for (const std::string& name : class_names) names.value(name);
  return names.end_array().str();
}

std::map<std::string, std::string> state_metadata(const TrainingState& s,
                                                  const std::string& architecture) {
  std::map<std::string, std::string> m = {
      {"format", kFormat},
      {"format_version", kFormatVersion},
      {"architecture", architecture},
      {"epoch", std::to_string(s.epoch)},
      {"step", std::to_string(s.step)},
      {"global_step", std::to_string(s.global_step)},
      {"optimizer_iterations", std::to_string(s.optimizer_iterations)},
      {"epoch_loss_sum", number(s.epoch_loss_sum)},
      {"epoch_correct", number(s.epoch_correct)},
      {"epoch_seen", number(s.epoch_seen)}};
  if (s.epoch_first_step >= 0) {
    m["epoch_seconds"] = number(s.epoch_seconds);
    m["epoch_samples"] = number(s.epoch_samples);
    m["epoch_first_step"] = std::to_string(s.epoch_first_step);
  }
  if (s.loss_scale > 0) {
    m[kLossScale] = number(s.loss_scale);
    m[kLossScaleGoodSteps] = std::to_string(s.loss_scale_good_steps);
  }
  return m;
}

// Metadata value key of a checkpoint as an integer in [0, max]: the checksum only proves the file
// is as written, not that whoever wrote it was dtrain.
const std::string& value_of(const std::map<std::string, std::string>& m, const char* key,
                            const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw common::IoError(fmt::format("{}: metadata has no \"{}\"", path, key));
  return it->second;
}

int64_t integer_of(const std::map<std::string, std::string>& m, const char* key, int64_t max,
                   const std::string& path) {
  const std::string& text = value_of(m, key, path);
  int64_t value = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0 || value > max) {
    throw common::IoError(
        fmt::format("{}: metadata \"{}\": expected an integer from 0 to {}, "
                    "found \"{}\"",
                    path, key, max, text.substr(0, 40)));
  }
  return value;
}

// Metadata value key as a finite number >= 0 (a running sum of losses, hits or examples).
double sum_of(const std::map<std::string, std::string>& m, const char* key,
              const std::string& path) {
  const std::string& text = value_of(m, key, path);
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0) {
    throw common::IoError(fmt::format("{}: metadata \"{}\": expected a number >= 0, found \"{}\"",
                                      path, key, text.substr(0, 40)));
  }
  return value;
}

TrainingState state_of(const std::map<std::string, std::string>& m, const std::string& path) {
  auto format = m.find("format"), version = m.find("format_version");
  if (format != m.end() && format->second == kFormat && version != m.end() &&
      version->second == "1") {
    throw common::IoError(fmt::format(
        "{}: a checkpoint of format version 1, written by an older dtrain, whose checksum does "
        "not cover the tensor index; this dtrain reads version {} only",
        path, kFormatVersion));
  }
  if (format == m.end() || format->second != kFormat || version == m.end() ||
      version->second != kFormatVersion) {
    throw common::IoError(
        fmt::format("{}: not a dtrain checkpoint of format version {}", path, kFormatVersion));
  }
  TrainingState s;
  s.epoch = integer_of(m, "epoch", kMaxEpochs, path);
  s.step = integer_of(m, "step", kMaxSteps, path);
  s.global_step = integer_of(m, "global_step", kMaxSteps, path);
  s.optimizer_iterations = integer_of(m, "optimizer_iterations", kMaxSteps, path);
  s.epoch_loss_sum = sum_of(m, "epoch_loss_sum", path);
  s.epoch_correct = sum_of(m, "epoch_correct", path);
  s.epoch_seen = sum_of(m, "epoch_seen", path);
  if (m.count("epoch_first_step") != 0) {
    s.epoch_seconds = sum_of(m, "epoch_seconds", path);
    s.epoch_samples = sum_of(m, "epoch_samples", path);
    s.epoch_first_step = integer_of(m, "epoch_first_step", kMaxSteps, path);
  }
  if (m.count(kLossScale) != 0) {
    s.loss_scale = sum_of(m, kLossScale, path);
    s.loss_scale_good_steps = integer_of(m, kLossScaleGoodSteps, kMaxSteps, path);
  }
  if (s.step > s.global_step) {
    throw common::IoError(fmt::format("{}: step {} of its epoch is past its global step {}", path,
                                      s.step, s.global_step));
  }
  return s;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

namespace {

std::string checkpoint_name(int64_t global_step) {
  return fmt::format("ckpt-{:010}.safetensors", global_step);
}

bool has_checkpoint_name(const std::string& n) {
  return n.rfind("ckpt-", 0) == 0 && n.size() > 17 && n.substr(n.size() - 12) == ".safetensors";
}

// A half-written checkpoint or index left by a kill during write_file_atomically.
bool is_temporary(const std::string& n) {
  return n.find(".tmp.") != std::string::npos &&
         (n.rfind(".ckpt-", 0) == 0 || n.rfind(std::string(".") + kIndex, 0) == 0);
}

}  // namespace

std::string CheckpointStore::save(const TrainingState& state,
                                  const std::vector<TensorView>& tensors,
                                  const std::string& architecture,
                                  const std::string& epoch_metrics) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw common::IoError(fmt::format("cannot create {}: {}", dir_, ec.message()));
  std::string name = checkpoint_name(state.global_step);
  std::string path = dir_ + "/" + name;
  fs::file_status status = fs::status(path, ec);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    throw common::ConfigError(fmt::format(
        "{}: something that is not a checkpoint file (a folder?) is in the way of this run's "
        "checkpoint; remove it",
        path));
  }
  std::map<std::string, std::string> metadata = state_metadata(state, architecture);
  if (!epoch_metrics.empty()) metadata[kEpochMetrics] = epoch_metrics;
  if (dtype_policy_ != "float32") metadata[kDtypePolicy] = dtype_policy_;
  if (!class_names_.empty()) metadata[kClassNames] = class_names_json(class_names_);
  common::write_file_atomically(
      path, encode_safetensors(tensors, std::move(metadata), ChecksumScope::kIndexToo));
  std::vector<std::string> kept = prune(name, architecture);
  common::JsonWriter index;
  index.begin_object().key("latest").value(name).key("all").begin_array();
  for (const std::string& n : kept) index.value(n);
  common::write_file_atomically(dir_ + "/" + kIndex, index.end_array().end_object().str() + "\n");
  return path;
}

// Keeps the newest `keep` checkpoints of this model, the one just written first, and deletes the
// older ones of this model. A file for another model, one that cannot be read, or one of a later
// step than this run has reached is not this run's to delete: it is left alone and reported once
// (it does not count towards `keep`, so it cannot push out the checkpoints this run writes).
std::vector<std::string> CheckpointStore::prune(const std::string& written,
                                                const std::string& architecture) {
  std::vector<std::string> kept = {written};
  for (const std::string& name : candidates()) {
    if (name == written) continue;
    std::string path = dir_ + "/" + name;
    std::string why;
    try {
      auto metadata = read_safetensors_metadata(path);
      if (metadata["architecture"] != architecture) why = "it is for another model architecture";
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (why.empty() && name > written) why = "its step is later than this run's";
    if (!why.empty()) {
      if (reported_.insert(name).second)
        spdlog::warn("keeping {}, which is not this run's to prune: {}", path, why);
      continue;
    }
    if (kept.size() < static_cast<size_t>(keep_)) {
      kept.push_back(name);
    } else {
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
  return kept;
}

// Checkpoint files in the folder, newest (highest global step) first. The index only says
// which is newest; the folder is the truth, so a lost or damaged index loses nothing. Only
// regular files count: a folder with a checkpoint's name is reported once and passed over.
std::vector<std::string> CheckpointStore::candidates() const {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::string n = entry.path().filename().string();
    if (!has_checkpoint_name(n)) continue;
    std::error_code type_ec;
    if (entry.is_regular_file(type_ec)) {
      names.push_back(n);
    } else if (reported_.insert(n).second) {
      spdlog::warn("skipping {}: not a regular file, so not a checkpoint", entry.path().string());
    }
  }
  std::sort(names.rbegin(), names.rend());
  return names;
}

std::optional<LoadedCheckpoint> CheckpointStore::load_latest(
    const std::string& architecture) const {
  for (const std::string& name : candidates()) {
    std::string path = dir_ + "/" + name;
    try {
      SafetensorsFile file = read_safetensors(path);
      if (file.metadata["architecture"] != architecture) {
        throw common::IoError(fmt::format("{}: written for another model architecture", path));
      }
      TrainingState state = state_of(file.metadata, path);
      if (file.checksum_scope != ChecksumScope::kIndexToo) {
        throw common::IoError(
            fmt::format("{}: its checksum does not cover the tensor index", path));
      }
      auto metrics = file.metadata.find(kEpochMetrics);
      std::string epoch_metrics = metrics == file.metadata.end() ? "" : metrics->second;
      auto policy = file.metadata.find(kDtypePolicy);
      std::string dtype_policy = policy == file.metadata.end() ? "float32" : policy->second;
      return LoadedCheckpoint{path, state, std::move(file), std::move(epoch_metrics),
                              std::move(dtype_policy)};
    } catch (const std::exception& e) {
      spdlog::warn("skipping checkpoint {}: {}", path, e.what());
    }
  }
  return std::nullopt;
}

// Deletes only what a store writes (checkpoints, the index, their temporaries), then the folder
// if that left it empty: whatever else is in it, or wherever it points, is not the store's.
void CheckpointStore::remove_all() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::string n = entry.path().filename().string();
    std::error_code type_ec;
    bool ours = has_checkpoint_name(n) || n == kIndex || is_temporary(n);
    if (ours && !entry.is_directory(type_ec)) fs::remove(entry.path(), type_ec);
  }
  fs::remove(dir_, ec);  // fails, as it should, unless the folder is now empty
}

std::optional<LoadedCheckpoint> load_finished_model(const std::string& model_path,
                                                    const std::string& launched_path,
                                                    const std::string& architecture,
                                                    const TrainingState& finished) {
  std::error_code launched_ec, written_ec;
  fs::file_time_type launched = fs::last_write_time(launched_path, launched_ec);
  fs::file_time_type written = fs::last_write_time(model_path, written_ec);
  if (launched_ec || written_ec || !(written > launched)) return std::nullopt;
  try {
    SafetensorsFile file = read_safetensors(model_path);
    if (file.metadata["architecture"] != architecture) return std::nullopt;
    auto policy = file.metadata.find(kDtypePolicy);
    std::string dtype_policy = policy == file.metadata.end() ? "float32" : policy->second;
    return LoadedCheckpoint{model_path, finished, std::move(file), "", std::move(dtype_policy)};
  } catch (const common::IoError& e) {
    spdlog::warn("not taking {} for finished training: {}", model_path, e.what());
    return std::nullopt;
  }
}

void restore_tensors(const LoadedCheckpoint& checkpoint, const std::vector<TensorView>& into) {
  for (const TensorView& v : into) {
    auto it = checkpoint.file.tensors.find(v.name);
    bool slot = v.name.rfind("optimizer.", 0) == 0;
    if (it == checkpoint.file.tensors.end() && slot) {  // the optimizer changed: a fresh slot
      spdlog::warn("{}: no tensor {}; it starts from zero", checkpoint.path, v.name);
      std::fill_n(const_cast<float*>(v.data), v.count, 0.0f);
      continue;
    }
    if (it == checkpoint.file.tensors.end() && v.name.rfind("callbacks.", 0) == 0) {
      // A callback the run did not have when it saved: it starts fresh (its zeros).
      spdlog::info("{}: no tensor {}; the callback starts afresh", checkpoint.path, v.name);
      std::fill_n(const_cast<float*>(v.data), v.count, 0.0f);
      continue;
    }
    if (it == checkpoint.file.tensors.end()) {
      throw common::ConfigError(fmt::format(
          "{}: has no tensor {}, which the model needs (shape [{}]); remove the file to resume "
          "from the checkpoint before it",
          checkpoint.path, v.name, fmt::join(v.shape, ", ")));
    }
    const Tensor& t = it->second;
    if (t.shape != v.shape || t.data.size() != v.count) {
      throw common::ConfigError(fmt::format(
          "{}: tensor {} has shape [{}] ({} values), the model's is [{}] ({} values); remove the "
          "file to resume from the checkpoint before it",
          checkpoint.path, v.name, fmt::join(t.shape, ", "), t.data.size(),
          fmt::join(v.shape, ", "), v.count));
    }
    std::copy(t.data.begin(), t.data.end(), const_cast<float*>(v.data));
  }
}

std::string vocabulary_json(const std::string& kind, const std::vector<std::string>& symbols,
                            int size) {
  if (kind.empty()) return {};
  common::JsonWriter w;
  w.begin_object().key("kind").value(kind);
  if (kind == "characters") {
    w.key("symbols").begin_array();
    for (const std::string& s : symbols) w.value(s);
    w.end_array();
  } else if (kind == "tokens") {
    w.key("size").value(size);
  }
  return w.end_object().str();
}

void write_final_model(const std::string& model_dir, const std::vector<TensorView>& weights,
                       const std::string& architecture_json, const std::string& dtype_policy,
                       const std::vector<std::string>& class_names,
                       const std::string& vocabulary_json) {
  std::error_code ec;
  fs::create_directories(model_dir, ec);
  if (ec) throw common::IoError(fmt::format("cannot create {}: {}", model_dir, ec.message()));
  std::map<std::string, std::string> metadata = {{"format", "dtrain-model"},
                                                 {"architecture", architecture_json}};
  DT_ENFORCE(!architecture_json.empty() && architecture_json[0] == '{', "architecture {}",
             architecture_json);
  std::string extra;  // model.json's keys before the architecture's
  if (dtype_policy != "float32") {
    metadata[kDtypePolicy] = dtype_policy;
    extra += fmt::format("\"dtype_policy\":\"{}\",", dtype_policy);
  }
  if (!class_names.empty()) {
    std::string list = class_names_json(class_names);
    metadata[kClassNames] = list;
    extra += "\"class_names\":" + list + ",";
  }
  if (!vocabulary_json.empty()) {
    metadata[kVocabulary] = vocabulary_json;
    extra += "\"vocabulary\":" + vocabulary_json + ",";
  }
  std::string model_json = "{" + extra + architecture_json.substr(1);
  common::write_file_atomically(model_dir + "/model.safetensors",
                                encode_safetensors(weights, std::move(metadata)));
  common::write_file_atomically(model_dir + "/model.json", model_json + "\n");
}

}  // namespace dtrain::train
