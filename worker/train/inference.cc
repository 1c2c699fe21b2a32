// See inference.h.
#include "worker/train/inference.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "worker/data/dataset.h"
#include "worker/data/folder_dataset.h"
#include "worker/data/idx_file.h"
#include "worker/data/image_folder.h"
#include "worker/data/npy_dataset.h"
#include "worker/data/npy_file.h"
#include "worker/data/npz_file.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/evaluator.h"
#include "worker/train/safetensors.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;
using common::ConfigError;

/// A run's final model, loaded on the CPU.
struct LoadedRun {
  TrainConfig config;
  std::unique_ptr<nn::Backend> backend;
  std::unique_ptr<nn::Model> model;
  std::vector<std::string> class_names;  ///< the directory source's, else empty
};

std::vector<std::string> read_class_names(const SafetensorsFile& file, const std::string& where) {
  std::vector<std::string> names;
  auto entry = file.metadata.find("class_names");
  if (entry == file.metadata.end()) return names;
  common::JsonDocument doc = common::JsonDocument::parse(entry->second, where + ": class_names");
  for (const common::JsonNode& name : doc.root().as_array()) names.push_back(name.as_string());
  return names;
}

LoadedRun load_run(const std::string& run_dir) {
  common::RunDir run(run_dir);
  const std::string spec_path = run.spec_json();
  if (!fs::exists(spec_path))
    throw ConfigError(fmt::format("{}: not a run directory (it has no spec.json)", run_dir));
  common::JsonDocument spec = common::JsonDocument::parse(
      common::read_file(spec_path, common::kMaxJsonFileBytes), spec_path);
  std::optional<common::JsonNode> train = spec.root().find("train");
  if (!train || !train->is_object()) {
    throw ConfigError(fmt::format(
        "{}: the job has no train object (a command job's model is its program's own)", spec_path));
  }
  LoadedRun loaded;
  loaded.config = parse_train_config(train->dump(), spec_path);
  const TrainConfig& config = loaded.config;
  const std::string path = run.model_dir() + "/model.safetensors";
  if (!fs::exists(path)) {
    throw ConfigError(fmt::format("{}: no final model (a run writes it when training ends)", path));
  }
  SafetensorsFile file = read_safetensors(path);
  if (file.metadata["architecture"] != config.model_json) {
    throw ConfigError(fmt::format(
        "{}: written by another model than the one {} records: the run was changed after it "
        "finished; launch it again to train the new model",
        path, spec_path));
  }
  nn::MathMode math = config.math == nn::MathMode::kTf32 ? nn::MathMode::kFloat32 : config.math;
  if (!nn::cpu_supports(math)) {
    spdlog::warn("the run trained under \"{}\"; {}: computing in float32", nn::math_mode_name(math),
                 cpu_policy_lack(math));
    math = nn::MathMode::kFloat32;
  }
  loaded.backend = nn::make_dnnl_backend(math);
  loaded.model =
      std::make_unique<nn::Model>(config.model, *loaded.backend, config.per_worker_batch_size);
  if (!load_weights(*loaded.model, file))
    throw ConfigError(fmt::format("{}: its tensors do not fit its architecture", path));
  loaded.class_names = read_class_names(file, path);
  return loaded;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  std::string tail = s.substr(s.size() - suffix.size());
  std::transform(tail.begin(), tail.end(), tail.begin(), ::tolower);
  return tail == suffix;
}

bool is_image_file(const std::string& path) {
  return ends_with(path, ".png") || ends_with(path, ".jpg") || ends_with(path, ".jpeg");
}

// An input's shape in the words input_shape uses: "28x28x1", or "20 features" (tabular).
std::string shape_words(int height, int width, int channels) {
  if (height == 1 && width == 1) return fmt::format("{} features", channels);
  return fmt::format("{}x{}x{}", height, width, channels);
}

void check_fits(const data::Dataset& d, const LoadedRun& run, const std::string& where) {
  const nn::ModelSpec& spec = run.config.model;
  if (d.height == spec.height && d.width == spec.width && d.channels == spec.channels) return;
  throw ConfigError(fmt::format("{}: the inputs are {} but the model takes {}", where,
                                shape_words(d.height, d.width, d.channels),
                                shape_words(spec.height, spec.width, spec.channels)));
}

// The first of keys the archive has, or "" (none).
std::string first_key(const data::NpzFile& archive, const std::vector<std::string>& keys) {
  for (const std::string& key : keys)
    if (archive.has(key)) return key;
  return "";
}

// Images of one IDX folder's test pair (t10k-images-idx3-ubyte[.gz] and t10k-labels-...).
std::optional<data::Dataset> idx_folder(const std::string& dir) {
  auto find = [&](const std::string& name) -> std::string {
    for (const std::string& candidate : {name, name + ".gz"})
      if (fs::is_regular_file(fs::path(dir) / candidate))
        return (fs::path(dir) / candidate).string();
    return "";
  };
  const std::string images = find("t10k-images-idx3-ubyte"),
                    labels = find("t10k-labels-idx1-ubyte");
  if (images.empty() || labels.empty()) return std::nullopt;
  return data::load_idx_pair(images, labels, data::Split::kTest);
}

// Arrays of inputs and labels as the run's loss reads them: class indices or float targets.
data::Dataset labelled(const data::NpyArray& x, const std::string& x_where, const data::NpyArray& y,
                       const std::string& y_where, const TrainConfig& config) {
  if (config.data.targets.empty())
    return data::dataset_from_npy(x, x_where, y, y_where, data::Split::kTest);
  return data::dataset_with_targets(x, x_where, y, y_where, config.data.targets);
}

data::Dataset evaluation_data(const LoadedRun& run, const EvaluateOptions& options,
                              std::string& what) {
  const TrainConfig& config = run.config;
  const std::string& path = options.data;
  if (path.empty()) {
    if (config.data.source == "npy" &&
        (config.data.test_images.empty() || config.data.test_labels.empty()) &&
        config.data.validation_split == 0) {
      throw ConfigError(
          "the run has no validation data (its npy source names no test_images and "
          "test_labels): give --data");
    }
    data::Dataset test = data::load_data(config.data, run.config.model.data_shape(), true).second;
    if (test.count == 0) throw ConfigError("the run has no validation data: give --data");
    what = config.data.validation_split > 0
               ? fmt::format("the run's validation data (the last {} of its training data)",
                             config.data.validation_split)
               : fmt::format("the run's validation data ({})", test.labels_source);
    return test;
  }
  what = path;
  if (!fs::exists(path)) throw ConfigError(fmt::format("--data: {}: no such file or folder", path));
  if (config.model.sequence) {
    throw ConfigError(fmt::format(
        "--data: {}: a language model is evaluated on its run's own validation text (leave "
        "--data out)",
        path));
  }
  if (fs::is_directory(path)) {
    if (std::optional<data::Dataset> idx = idx_folder(path)) return std::move(*idx);
    data::ImageFolder folder = data::scan_image_folder(path, run.class_names);
    return data::load_image_list(config.data, folder,
                                 run.class_names.empty() ? folder.class_names : run.class_names,
                                 run.config.model.data_shape());
  }
  if (ends_with(path, ".npz")) {
    data::NpzFile archive(path);
    const std::string x = first_key(archive, {config.data.x_test, "x_test", "x"});
    const std::string y = first_key(archive, {config.data.y_test, "y_test", "y"});
    if (x.empty() || y.empty()) {
      throw ConfigError(fmt::format(
          "--data: {}: no inputs and labels to evaluate: expected the keys {} and {} (or x_test "
          "and y_test, or x and y); it has {}",
          path, config.data.x_test, config.data.y_test, fmt::join(archive.keys(), ", ")));
    }
    return labelled(archive.read(x, data::kNpyImageDtypes), path + ": " + x,
                    archive.read(y, data::kNpyAnyDtype), path + ": " + y, config);
  }
  if (options.labels.empty()) {
    throw ConfigError(fmt::format(
        "--data: {}: expected an .npz archive, a folder of class folders or IDX files, or an "
        ".npy or IDX images file with --labels",
        path));
  }
  if (ends_with(path, ".npy")) {
    return labelled(data::read_npy(path, data::kNpyImageDtypes), path,
                    data::read_npy(options.labels, data::kNpyAnyDtype), options.labels, config);
  }
  return data::load_idx_pair(path, options.labels, data::Split::kTest);
}

/// The inputs of predict, and each one's name for a CSV (a file's path, else its index).
struct Inputs {
  data::Dataset data;
  std::vector<std::string> names;
};

// Every image under dir (a file: itself), found by walking it in sorted path order.
data::ImageFolder image_files(const std::string& path) {
  data::ImageFolder folder;
  folder.dir = path;
  folder.class_names = {""};
  if (!fs::is_directory(path)) {
    folder.files.push_back({path, 0});
    return folder;
  }
  std::vector<std::string> found;
  for (auto it = fs::recursive_directory_iterator(path); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && is_image_file(name)) found.push_back(it->path().string());
  }
  std::sort(found.begin(), found.end());
  if (found.empty())
    throw ConfigError(fmt::format("--input: {}: no .png, .jpg or .jpeg file in it", path));
  for (const std::string& file : found) folder.files.push_back({file, 0});
  return folder;
}

Inputs prediction_inputs(const LoadedRun& run, const std::string& path) {
  if (!fs::exists(path))
    throw ConfigError(fmt::format("--input: {}: no such file or folder", path));
  if (run.config.model.sequence) {
    throw ConfigError(
        "--input: the run's model is a language model: `dtrain generate` samples from it");
  }
  Inputs inputs;
  if (fs::is_directory(path) || is_image_file(path)) {
    data::ImageFolder folder = image_files(path);
    inputs.data = data::load_image_list(run.config.data, folder, {}, run.config.model.data_shape());
    for (const data::ImageFile& file : folder.files) inputs.names.push_back(file.path);
    return inputs;
  }
  if (ends_with(path, ".npz")) {
    data::NpzFile archive(path);
    std::vector<std::string> keys = archive.keys();
    std::string x = first_key(archive, {run.config.data.x_test, "x_test", "x"});
    if (x.empty() && keys.size() == 1) x = keys.front();
    if (x.empty()) {
      throw ConfigError(fmt::format(
          "--input: {}: which member holds the inputs? expected {}, x_test, x or a single member; "
          "it has {}",
          path, run.config.data.x_test, fmt::join(keys, ", ")));
    }
    inputs.data = data::images_from_npy(archive.read(x, data::kNpyImageDtypes), path + ": " + x);
  } else if (ends_with(path, ".npy")) {
    inputs.data = data::images_from_npy(data::read_npy(path, data::kNpyImageDtypes), path);
  } else {
    data::IdxArray images = data::read_idx(path, data::IdxKind::kImages);
    inputs.data.count = images.dims[0];
    inputs.data.height = static_cast<int>(images.dims[1]);
    inputs.data.width = static_cast<int>(images.dims[2]);
    inputs.data.channels = 1;
    inputs.data.bytes = std::move(images.data);
  }
  inputs.data.labels.assign(static_cast<size_t>(inputs.data.count), 0);
  for (int64_t i = 0; i < inputs.data.count; ++i) inputs.names.push_back(std::to_string(i));
  return inputs;
}

// A .npy file (format 1.0) of a float32 array of shape (rows, columns).
std::string npy_bytes(const std::vector<float>& values, int64_t rows, int columns) {
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, columns);
  // magic (6) + version (2) + length (2) + header + '\n', a multiple of 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  const size_t at = out.size();
  out.resize(at + values.size() * sizeof(float));
  std::memcpy(out.data() + at, values.data(), values.size() * sizeof(float));  // little-endian
  return out;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

// The CSV: a header, then per input its name, the predicted class (the cross-entropies over
// classes: the arg-max; binary_crossentropy of one output: 1 above the threshold, else 0) and
// each output. A regression's or a multi-label model's lines have no predicted class.
std::string csv_bytes(const Inputs& inputs, const std::vector<float>& values, int columns,
                      const std::vector<std::string>& class_names, const TrainConfig& config) {
  auto name = [&](int k) {
    return static_cast<size_t>(k) < class_names.size() ? class_names[static_cast<size_t>(k)]
                                                       : fmt::format("class_{}", k);
  };
  const bool classes =
      config.loss == nn::Loss::kSparseCategorical || config.loss == nn::Loss::kCategorical;
  const bool binary = config.loss == nn::Loss::kBinary && columns == 1;
  std::string out = "input";
  if (classes || binary) out += ",predicted";
  for (int k = 0; k < columns; ++k)
    out += "," + csv_field(classes ? name(k) : fmt::format("output_{}", k));
  out += "\n";
  const float threshold = config.from_logits ? 0.0f : 0.5f;  // a logit of 0 is p = 0.5
  for (size_t i = 0; i < inputs.names.size(); ++i) {
    const float* row = values.data() + i * static_cast<size_t>(columns);
    out += csv_field(inputs.names[i]);
    if (classes)
      out += "," + csv_field(name(static_cast<int>(std::max_element(row, row + columns) - row)));
    if (binary) out += "," + csv_field(name(row[0] > threshold ? 1 : 0));
    for (int k = 0; k < columns; ++k) out += fmt::format(",{}", row[k]);
    out += "\n";
  }
  return out;
}

// softmax of each row, in double, as the loss computes it.
void softmax_rows(std::vector<float>& values, int64_t rows, int columns) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = values.data() + i * columns;
    const float top = *std::max_element(row, row + columns);
    double total = 0;
    for (int k = 0; k < columns; ++k) total += std::exp(static_cast<double>(row[k] - top));
    for (int k = 0; k < columns; ++k)
      row[k] = static_cast<float>(std::exp(static_cast<double>(row[k] - top)) / total);
  }
}

}  // namespace

Evaluation evaluate_run(const EvaluateOptions& options) {
  LoadedRun run = load_run(options.run_dir);
  Evaluation result;
  data::Dataset data = evaluation_data(run, options, result.data);
  if (!run.config.data.targets.empty())  // a class-index file or folder, as the run's source
    data::to_targets(data, run.config.data.targets, run.model->classes());
  if (!data.is_text()) check_fits(data, run, options.data.empty() ? result.data : options.data);
  data::check_labels_below(data, run.model->classes());
  const Scores scores =
      evaluate_model(*run.model, *run.backend, data, run.config.per_worker_batch_size, nullptr,
                     loss_options(run.config), run.config.metrics);
  result.examples = data.count;
  result.loss = scores.loss;
  result.metrics = named_scores(run.config, scores, "");
  result.metrics.erase(result.metrics.begin());  // the loss
  return result;
}

Prediction predict_run(const PredictOptions& options) {
  const bool csv = ends_with(options.output, ".csv");
  if (!csv && !ends_with(options.output, ".npy"))
    throw ConfigError(
        fmt::format("--output: {}: expected a name ending in .npy or .csv", options.output));
  LoadedRun run = load_run(options.run_dir);
  Inputs inputs = prediction_inputs(run, options.input);
  check_fits(inputs.data, run, options.input);
  nn::Model& model = *run.model;
  const int batch = run.config.per_worker_batch_size, columns = model.classes();
  const size_t per_example =
      static_cast<size_t>(inputs.data.height) * inputs.data.width * inputs.data.channels;
  nn::Buffer<float> images(run.backend->device(), per_example * static_cast<size_t>(batch));
  std::vector<float> host(per_example * static_cast<size_t>(batch));
  std::vector<float> values(static_cast<size_t>(inputs.data.count) * static_cast<size_t>(columns));
  for (int64_t first = 0; first < inputs.data.count; first += batch) {
    const int n = static_cast<int>(std::min<int64_t>(batch, inputs.data.count - first));
    data::copy_nchw(inputs.data, first, n, host.data());
    images.from_host(host);
    const float* y = model.forward(images.data(), n, {}, false);
    run.backend->device().download(values.data() + static_cast<size_t>(first) * columns, y,
                                   static_cast<size_t>(n) * columns * sizeof(float));
  }
  const bool softmax =
      run.config.model.nodes.back().config->activation() == nn::Activation::kSoftmax;
  if (softmax) softmax_rows(values, inputs.data.count, columns);
  common::write_file_atomically(
      options.output, csv ? csv_bytes(inputs, values, columns, run.class_names, run.config)
                          : npy_bytes(values, inputs.data.count, columns));
  return {inputs.data.count, columns};
}

}  // namespace dtrain::train
