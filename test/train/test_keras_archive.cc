// The final model of a job whose model came from Keras is also RUN_DIR/model/model.keras:
// dtrain-worker trains a Sequential CNN (Flatten of a feature map, then BatchNormalization and
// Dense on its features) and a Functional residual block (BatchNormalization, a projection
// shortcut, GlobalAveragePooling2D) from Keras fixtures, and read_keras_archive.py (zipfile,
// json, h5py) finds Keras's three members, its metadata keys, the config as read, the HDF5 groups
// exactly as Keras's saving_lib names them and each variable in Keras's shape; its numpy forward
// pass, channels last from the archive, gives the logits dtrain's model gives from
// model.safetensors (to 1e-4: the kernels' transposes and the features' reordering). A model
// whose features Keras would order differently is refused before training; a failed write names
// the file and leaves none, as a failed HDF5 call names its object; dtrain reads the archive back
// as the same model. A miniature GPT's archive nests MultiHeadAttention's and
// TokenAndPositionEmbedding's sublayers' variables where saving_lib puts them, each the trained
// tensor. Needs python3-numpy and python3-h5py (scripts/setup.sh --tests).
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "test/support/python.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "test/train/keras_fixtures.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/keras_model.h"
#include "worker/train/hdf5_image.h"
#include "worker/train/keras_archive.h"
#include "worker/train/model_tensors.h"
#include "worker/train/safetensors.h"

using namespace dtrain;
namespace kf = dtrain::testing::keras;

namespace {

constexpr int kImages = 5;

bool h5py_available() {
  return testing::python_imports("numpy, h5py");
}

kf::Layer with_momentum(kf::Layer bn, const char* momentum) {
  bn.config.set("momentum", momentum);
  return bn;
}

// The chain of keras_fixtures.h with a BatchNormalization on the flattened features: the
// Flatten of a 2 x 2 x 6 map orders them (h, w, c) in Keras, (c, h, w) in dtrain.
std::string sequential_model() {
  std::vector<kf::Layer> layers = kf::chain_layers();
  layers.insert(layers.begin() + 7,
                with_momentum(kf::batch_normalization("batch_normalization", "[null, 24]"), "0.5"));
  return kf::sequential(layers);
}

// A residual block listed so that Keras's order of the layers (by depth from the output) is not
// the file's: the projection shortcut comes before the block's convolution here, after it in
// model.layers, so it is conv2d_2, not conv2d_1.
std::string functional_model() {
  const std::string wide = "[null, 8, 8, 4]", narrow = "[null, 4, 4, 8]";
  std::vector<kf::Layer> layers = {
      kf::input_layer("image", "[null, 8, 8, 1]"),
      kf::on(kf::conv2d_no_bias("stem", 4, "[3, 3]", "[1, 1]", wide), {"image"}),
      kf::on(with_momentum(kf::batch_normalization("stem_bn", wide), "0.5"), {"stem"}),
      kf::on(kf::relu("stem_relu", wide), {"stem_bn"}),
      kf::on(kf::conv2d("shortcut", 8, "[1, 1]", "[2, 2]", "valid", "linear", narrow),
             {"stem_relu"}),
      kf::on(kf::conv2d_no_bias("block_conv", 8, "[3, 3]", "[2, 2]", narrow), {"stem_relu"}),
      kf::on(with_momentum(kf::batch_normalization("block_bn", narrow), "0.5"), {"block_conv"}),
      kf::on(kf::add("sum", narrow), {"block_bn", "shortcut"}),
      kf::on(kf::relu("sum_relu", narrow), {"sum"}),
      kf::on(kf::global_average_pooling2d("pool", "[null, 8]"), {"sum_relu"}),
      kf::on(kf::dense("logits", 3, "linear", "[null, 3]"), {"pool"})};
  return kf::functional(layers, R"(["image", 0, 0])", R"(["logits", 0, 0])");
}

// Trains the Keras model text for two steps with dtrain-worker in dir; returns the run folder.
// from_logits: the model ends without a softmax.
std::string train_keras(const testing::TempDir& dir, const std::string& keras_json,
                        bool from_logits) {
  common::write_file_atomically(dir.path() + "/model.json", keras_json);
  common::write_file_atomically(dir.path() + "/job.json",
                                R"({"job": "keras-save", "train": {
      "model": {"keras": "model.json"},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": )" +
                                    std::string(from_logits ? "true" : "false") + R"(},
      "optimizer": {"type": "sgd", "learning_rate": 0.1, "momentum": 0.9},
      "data": {"source": "synthetic", "examples": 64, "classes": 3},
      "per_worker_batch_size": 16, "epochs": 1, "steps_per_epoch": 2, "device": "cpu"}})");
  testing::ProcessOptions options;
  options.cwd = dir.path();  // the model file is relative to the working directory
  options.timeout_seconds = 120;
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", "job.json", "--run-dir", dir.path() + "/run"},
      options);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  return dir.path() + "/run";
}

// kImages images, channels last (8 x 8 x 1), deterministic and spread over [-1, 1].
std::vector<float> images() {
  std::vector<float> x(kImages * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
  return x;
}

// read_keras_archive.py's JSON about archive (with the logits of images when given).
common::JsonDocument read_archive(const std::string& archive, const std::string& inputs = "") {
  std::vector<std::string> argv = {
      testing::kSystemPython, std::string(DTRAIN_SOURCE_DIR) + "/test/train/read_keras_archive.py",
      archive};
  if (!inputs.empty()) argv.insert(argv.end(), {"--inputs", inputs});
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  auto r = testing::run_process(argv, options);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return common::JsonDocument::parse(r.out, "read_keras_archive.py");
}

// The logits dtrain's model gives on the images (channels last, as Keras takes them), at
// inference, with the weights of run/model/model.safetensors.
std::vector<float> dtrain_logits(const std::string& keras_json, const std::string& run,
                                 const std::vector<float>& nhwc) {
  train::KerasModel m = train::translate_keras_model(keras_json, "model.json");
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  nn::Model model(m.spec, *backend, kImages);
  train::ModelTensors tensors(model, {});
  train::SafetensorsFile file = train::read_safetensors(run + "/model/model.safetensors");
  for (const train::TensorView& v : tensors.download()) {
    const train::Tensor& t = file.tensors.at(v.name);
    REQUIRE(t.data.size() == v.count);
    std::copy(t.data.begin(), t.data.end(), const_cast<float*>(v.data));
  }
  tensors.upload();
  const nn::Dims d = m.spec.input_dims();
  std::vector<float> nchw(nhwc.size());
  for (int n = 0; n < kImages; ++n)
    for (int y = 0; y < d.h; ++y)
      for (int x = 0; x < d.w; ++x)
        for (int c = 0; c < d.c; ++c)
          nchw[((n * d.c + c) * d.h + y) * d.w + x] = nhwc[((n * d.h + y) * d.w + x) * d.c + c];
  const float* logits = model.forward(nchw.data(), kImages, nn::StepKey{}, false);
  return std::vector<float>(logits, logits + kImages * model.classes());
}

std::vector<std::string> strings(const common::JsonNode& node) {
  std::vector<std::string> out;
  for (const common::JsonNode& item : node.as_array()) out.push_back(item.as_string());
  return out;
}

// The archive's members, metadata and config, as Keras writes them.
void check_members(const common::JsonNode& out, const std::string& keras_json) {
  std::vector<std::string> names;
  for (const common::JsonNode& m : out.at("members").as_array()) {
    names.push_back(m.at("name").as_string());
    CHECK(m.at("compress_type").as_int(0, 100) == 0);  // stored, as Keras's ZipFile default
  }
  CHECK(names == std::vector<std::string>{"metadata.json", "config.json", "model.weights.h5"});
  common::JsonNode metadata = out.at("metadata");
  CHECK(metadata.as_object().size() == 2);
  CHECK(std::regex_match(metadata.at("keras_version").as_string(), std::regex(R"(3\.\d+\.\d+)")));
  CHECK(std::regex_match(metadata.at("date_saved").as_string(),
                         std::regex(R"(\d{4}-\d\d-\d\d@\d\d:\d\d:\d\d)")));
  common::JsonDocument fixture = common::JsonDocument::parse(keras_json, "fixture");
  CHECK(out.at("config").dump() == fixture.root().dump());
}

void check_logits(const common::JsonNode& out, const std::vector<float>& expected) {
  std::vector<common::JsonNode> rows = out.at("logits").as_array();
  REQUIRE(rows.size() * 3 == expected.size());
  double worst = 0;
  for (size_t n = 0; n < rows.size(); ++n) {
    std::vector<common::JsonNode> row = rows[n].as_array();
    REQUIRE(row.size() == 3);
    for (size_t k = 0; k < 3; ++k)
      worst = std::max(worst, std::abs(row[k].as_number(-1e30, 1e30) - expected[n * 3 + k]));
  }
  INFO("largest difference " << worst);
  CHECK(worst < 1e-4);
}

void write_images(const std::string& path, const std::vector<float>& x) {
  common::write_file_atomically(
      path, std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
}

}  // namespace

TEST_CASE("a Keras Sequential's model.keras has Keras's layout and computes dtrain's logits",
          "[keras][archive]") {
  if (!h5py_available()) {
    WARN("skipped: " << testing::kSystemPython
                     << " lacks numpy or h5py (scripts/setup.sh --tests)");
    return;
  }
  testing::TempDir dir;
  const std::string keras_json = sequential_model();
  const std::string run = train_keras(dir, keras_json, false);
  write_images(dir.path() + "/images.f32", images());
  common::JsonDocument doc = read_archive(run + "/model/model.keras", dir.path() + "/images.f32");
  check_members(doc.root(), keras_json);
  // A Sequential's model.layers leave out its InputLayer; layers without weights have a group.
  const std::vector<std::string> expected = {
      "dataset layers/batch_normalization/vars/0 [24] <f4",
      "dataset layers/batch_normalization/vars/1 [24] <f4",
      "dataset layers/batch_normalization/vars/2 [24] <f4",
      "dataset layers/batch_normalization/vars/3 [24] <f4",
      "dataset layers/conv2d/vars/0 [3,3,1,4] <f4",
      "dataset layers/conv2d/vars/1 [4] <f4",
      "dataset layers/conv2d_1/vars/0 [3,3,4,6] <f4",
      "dataset layers/conv2d_1/vars/1 [6] <f4",
      "dataset layers/dense/vars/0 [24,16] <f4",
      "dataset layers/dense/vars/1 [16] <f4",
      "dataset layers/dense_1/vars/0 [16,3] <f4",
      "dataset layers/dense_1/vars/1 [3] <f4",
      "group layers",
      "group layers/batch_normalization",
      "group layers/batch_normalization/vars name=batch_normalization",
      "group layers/conv2d",
      "group layers/conv2d/vars name=conv2d",
      "group layers/conv2d_1",
      "group layers/conv2d_1/vars name=conv2d_1",
      "group layers/dense",
      "group layers/dense/vars name=dense",
      "group layers/dense_1",
      "group layers/dense_1/vars name=dense_1",
      "group layers/dropout",
      "group layers/dropout/vars name=dropout",
      "group layers/flatten",
      "group layers/flatten/vars name=flatten",
      "group layers/max_pooling2d",
      "group layers/max_pooling2d/vars name=max_pooling2d",
      "group layers/re_lu",
      "group layers/re_lu/vars name=re_lu",
      "group vars name=sequential"};
  CHECK(strings(doc.root().at("h5")) == expected);
  check_logits(doc.root(), dtrain_logits(keras_json, run, images()));
  // dtrain reads the archive back as a Keras model file: the same model.
  CHECK(train::read_keras_model(run + "/model/model.keras").model_json ==
        train::translate_keras_model(keras_json, "model.json").model_json);
}

TEST_CASE("a Keras Functional's model.keras names its layers in Keras's order",
          "[keras][archive]") {
  if (!h5py_available()) {
    WARN("skipped: " << testing::kSystemPython
                     << " lacks numpy or h5py (scripts/setup.sh --tests)");
    return;
  }
  testing::TempDir dir;
  const std::string keras_json = functional_model();
  const std::string run = train_keras(dir, keras_json, true);
  write_images(dir.path() + "/images.f32", images());
  common::JsonDocument doc = read_archive(run + "/model/model.keras", dir.path() + "/images.f32");
  check_members(doc.root(), keras_json);
  // A Functional's model.layers has its InputLayer, and is ordered by depth from the output.
  const std::vector<std::string> expected = {
      "dataset layers/batch_normalization/vars/0 [4] <f4",
      "dataset layers/batch_normalization/vars/1 [4] <f4",
      "dataset layers/batch_normalization/vars/2 [4] <f4",
      "dataset layers/batch_normalization/vars/3 [4] <f4",
      "dataset layers/batch_normalization_1/vars/0 [8] <f4",
      "dataset layers/batch_normalization_1/vars/1 [8] <f4",
      "dataset layers/batch_normalization_1/vars/2 [8] <f4",
      "dataset layers/batch_normalization_1/vars/3 [8] <f4",
      "dataset layers/conv2d/vars/0 [3,3,1,4] <f4",
      "dataset layers/conv2d_1/vars/0 [3,3,4,8] <f4",
      "dataset layers/conv2d_2/vars/0 [1,1,4,8] <f4",
      "dataset layers/conv2d_2/vars/1 [8] <f4",
      "dataset layers/dense/vars/0 [8,3] <f4",
      "dataset layers/dense/vars/1 [3] <f4",
      "group layers",
      "group layers/add",
      "group layers/add/vars name=sum",
      "group layers/batch_normalization",
      "group layers/batch_normalization/vars name=stem_bn",
      "group layers/batch_normalization_1",
      "group layers/batch_normalization_1/vars name=block_bn",
      "group layers/conv2d",
      "group layers/conv2d/vars name=stem",
      "group layers/conv2d_1",
      "group layers/conv2d_1/vars name=block_conv",
      "group layers/conv2d_2",
      "group layers/conv2d_2/vars name=shortcut",
      "group layers/dense",
      "group layers/dense/vars name=logits",
      "group layers/global_average_pooling2d",
      "group layers/global_average_pooling2d/vars name=pool",
      "group layers/input_layer",
      "group layers/input_layer/vars name=image",
      "group layers/re_lu",
      "group layers/re_lu/vars name=stem_relu",
      "group layers/re_lu_1",
      "group layers/re_lu_1/vars name=sum_relu",
      "group vars name=functional"};
  CHECK(strings(doc.root().at("h5")) == expected);
  check_logits(doc.root(), dtrain_logits(keras_json, run, images()));
}

TEST_CASE("a Keras GPT's model.keras nests its sublayers' variables as saving_lib does",
          "[keras][archive]") {
  if (!h5py_available()) {
    WARN("skipped: " << testing::kSystemPython
                     << " lacks numpy or h5py (scripts/setup.sh --tests)");
    return;
  }
  // The miniature GPT with biases in its attention and a beta in its first normalization.
  std::vector<kf::Layer> layers = kf::gpt_layers();
  layers[2].config.set("center", "true");
  layers[3].config.set("use_bias", "true");
  const std::string keras_json =
      kf::functional(layers, R"(["input_layer", 0, 0])", R"(["dense_2", 0, 0])");
  testing::TempDir dir;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "abcdefghij\n"[(i * 7 + i / 11) % 11];
  common::write_file_atomically(dir.path() + "/text.txt", text);
  common::write_file_atomically(dir.path() + "/model.json", keras_json);
  common::write_file_atomically(dir.path() + "/job.json", R"({"job": "keras-gpt", "train": {
      "model": {"keras": "model.json"},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"type": "adam", "learning_rate": 0.01},
      "data": {"source": "text", "path": "text.txt"},
      "per_worker_batch_size": 4, "epochs": 1, "steps_per_epoch": 2, "device": "cpu"}})");
  testing::ProcessOptions options;
  options.cwd = dir.path();
  options.timeout_seconds = 120;
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", "job.json", "--run-dir", dir.path() + "/run"},
      options);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string run = dir.path() + "/run";

  std::vector<std::string> argv = {
      testing::kSystemPython, std::string(DTRAIN_SOURCE_DIR) + "/test/train/read_keras_archive.py",
      run + "/model/model.keras", "--values"};
  auto py = testing::run_process(argv, options);
  INFO(py.err);
  REQUIRE(py.exit_code == 0);
  common::JsonDocument doc = common::JsonDocument::parse(py.out, "read_keras_archive.py");
  check_members(doc.root(), keras_json);
  // MultiHeadAttention's EinsumDense projections under the properties saving_lib walks first
  // (key_dense, output_dense, query_dense, value_dense), its Softmax and Dropout under their
  // private attributes; TokenAndPositionEmbedding's two tables under their sublayers.
  const std::string mha = "layers/multi_head_attention/",
                    tape = "layers/token_and_position_embedding/";
  std::vector<std::string> expected = {"dataset layers/dense/vars/0 [16,32] <f4",
                                       "dataset layers/dense_1/vars/0 [32,16] <f4",
                                       "dataset layers/dense_2/vars/0 [16,11] <f4",
                                       "dataset layers/layer_normalization/vars/0 [16] <f4",
                                       "dataset layers/layer_normalization/vars/1 [16] <f4",
                                       "dataset layers/layer_normalization_1/vars/0 [16] <f4",
                                       "dataset layers/layer_normalization_2/vars/0 [16] <f4",
                                       "dataset " + mha + "key_dense/vars/0 [16,2,8] <f4",
                                       "dataset " + mha + "key_dense/vars/1 [2,8] <f4",
                                       "dataset " + mha + "output_dense/vars/0 [2,8,16] <f4",
                                       "dataset " + mha + "output_dense/vars/1 [16] <f4",
                                       "dataset " + mha + "query_dense/vars/0 [16,2,8] <f4",
                                       "dataset " + mha + "query_dense/vars/1 [2,8] <f4",
                                       "dataset " + mha + "value_dense/vars/0 [16,2,8] <f4",
                                       "dataset " + mha + "value_dense/vars/1 [2,8] <f4",
                                       "dataset " + tape + "position_embedding/vars/0 [8,16] <f4",
                                       "dataset " + tape + "token_embedding/vars/0 [11,16] <f4",
                                       "group layers",
                                       "group vars name=functional"};
  for (const char* layer : {"add", "add_1", "dense", "dense_1", "dense_2", "input_layer",
                            "layer_normalization", "layer_normalization_1", "layer_normalization_2",
                            "multi_head_attention", "token_and_position_embedding"}) {
    expected.push_back(fmt::format("group layers/{}", layer));
    expected.push_back(fmt::format("group layers/{}/vars name={}", layer, layer));
  }
  for (const auto& [attribute, name] :
       std::vector<std::pair<std::string, std::string>>{{"_dropout_layer", "dropout"},
                                                        {"_softmax", "softmax"},
                                                        {"key_dense", "key"},
                                                        {"output_dense", "attention_output"},
                                                        {"query_dense", "query"},
                                                        {"value_dense", "value"}}) {
    expected.push_back("group " + mha + attribute);
    expected.push_back("group " + mha + attribute + "/vars name=" + name);
  }
  for (const char* table : {"position_embedding", "token_embedding"}) {
    expected.push_back("group " + tape + table);
    expected.push_back("group " + tape + table + "/vars name=" + table);
  }
  std::sort(expected.begin(), expected.end());
  CHECK(strings(doc.root().at("h5")) == expected);
  // Each dataset holds the trained tensor of model.safetensors, in the same layout.
  const std::vector<std::pair<std::string, std::string>> places = {
      {tape + "token_embedding/vars/0", "token_and_position_embedding.token_embedding.embeddings"},
      {tape + "position_embedding/vars/0",
       "token_and_position_embedding.position_embedding.embeddings"},
      {"layers/layer_normalization/vars/0", "layer_normalization.gamma"},
      {"layers/layer_normalization/vars/1", "layer_normalization.beta"},
      {mha + "query_dense/vars/0", "multi_head_attention.query.kernel"},
      {mha + "query_dense/vars/1", "multi_head_attention.query.bias"},
      {mha + "key_dense/vars/0", "multi_head_attention.key.kernel"},
      {mha + "key_dense/vars/1", "multi_head_attention.key.bias"},
      {mha + "value_dense/vars/0", "multi_head_attention.value.kernel"},
      {mha + "value_dense/vars/1", "multi_head_attention.value.bias"},
      {mha + "output_dense/vars/0", "multi_head_attention.attention_output.kernel"},
      {mha + "output_dense/vars/1", "multi_head_attention.attention_output.bias"},
      {"layers/layer_normalization_1/vars/0", "layer_normalization_1.gamma"},
      {"layers/dense/vars/0", "dense.kernel"},
      {"layers/dense_1/vars/0", "dense_1.kernel"},
      {"layers/layer_normalization_2/vars/0", "layer_normalization_2.gamma"},
      {"layers/dense_2/vars/0", "dense_2.kernel"}};
  train::SafetensorsFile file = train::read_safetensors(run + "/model/model.safetensors");
  CHECK(file.tensors.size() == places.size());
  for (const auto& [path, name] : places) {
    INFO(path << " " << name);
    const std::vector<float>& want = file.tensors.at(name).data;
    std::vector<common::JsonNode> got = doc.root().at("values").at(path).as_array();
    REQUIRE(got.size() == want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i)
      differ += static_cast<float>(got[i].as_number(-1e30, 1e30)) != want[i];
    CHECK(differ == 0);
  }
}

TEST_CASE("a Keras model whose features Keras orders differently is refused before training",
          "[keras][archive]") {
  // The flattened map (Keras's h, w, c order) added to a Dense's features (no such order).
  std::vector<kf::Layer> layers = {
      kf::input_layer("input_layer", "[null, 4, 4, 1]"),
      kf::on(kf::conv2d("conv2d", 2, "[3, 3]", "[1, 1]", "same", "relu", "[null, 4, 4, 2]"),
             {"input_layer"}),
      kf::on(kf::flatten("flatten", "[null, 32]"), {"conv2d"}),
      kf::on(kf::dense("dense", 32, "relu", "[null, 32]"), {"flatten"}),
      kf::on(kf::add("add", "[null, 32]"), {"flatten", "dense"}),
      kf::on(kf::dense("dense_1", 3, "linear", "[null, 3]"), {"add"})};
  const std::string json =
      kf::functional(layers, R"(["input_layer", 0, 0])", R"(["dense_1", 0, 0])");
  CHECK_THROWS_WITH(train::translate_keras_model(json, "model.json"),
                    Catch::Contains("model.json: layer \"add\" (Add): it adds features that "
                                    "Keras orders differently"));
  // A 1 x 1 map's features are in the same order in both: accepted.
  layers[0] = kf::input_layer("input_layer", "[null, 1, 1, 1]");
  layers[1] = kf::on(kf::conv2d("conv2d", 2, "[1, 1]", "[1, 1]", "same", "relu", "[null, 1, 1, 2]"),
                     {"input_layer"});
  layers[2] = kf::on(kf::flatten("flatten", "[null, 2]"), {"conv2d"});
  layers[3] = kf::on(kf::dense("dense", 2, "relu", "[null, 2]"), {"flatten"});
  layers[4] = kf::on(kf::add("add", "[null, 2]"), {"flatten", "dense"});
  CHECK_NOTHROW(train::translate_keras_model(
      kf::functional(layers, R"(["input_layer", 0, 0])", R"(["dense_1", 0, 0])"), "model.json"));
}

TEST_CASE("a model.keras that cannot be written is an error naming it, and no file",
          "[keras][archive]") {
  testing::TempDir dir;
  const std::string keras_json = sequential_model();
  train::KerasModel m = train::translate_keras_model(keras_json, "model.json");
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  nn::Model model(m.spec, *backend, 1);
  model.initialize(3);
  train::ModelTensors tensors(model, {});
  const std::vector<train::TensorView> weights = tensors.download();
  // A file where the folder should be.
  common::write_file_atomically(dir.path() + "/model", "not a folder");
  const std::string path = dir.path() + "/model/model.keras";
  CHECK_THROWS_WITH(
      train::write_keras_archive(path, m.keras_config, m.spec, weights, std::time(nullptr)),
      Catch::Contains(path));
  CHECK_FALSE(std::filesystem::exists(path));
  // Written where it can be: then it replaces what was there, whole.
  const std::string good = dir.path() + "/model.keras";
  common::write_file_atomically(good, "an older file");
  train::write_keras_archive(good, m.keras_config, m.spec, weights, std::time(nullptr));
  CHECK(common::read_file(good).compare(0, 4, "PK\x03\x04") == 0);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"model", "model.keras"});  // no temporary file
}

TEST_CASE("an HDF5 image's failed call names the file, the object and HDF5's reason",
          "[keras][archive]") {
  train::Hdf5Image h5("x.keras: model.weights.h5");
  const float value = 1;
  CHECK_THROWS_WITH(h5.add_dataset("missing/0", {1}, &value),
                    Catch::StartsWith("x.keras: model.weights.h5: cannot create the dataset "
                                      "missing/0 (HDF5: "));
  h5.add_group("layers/dense/vars");  // with the groups above it
  CHECK_THROWS_WITH(h5.add_group("layers/dense/vars"),
                    Catch::Contains("cannot create the group layers/dense/vars"));
  h5.add_dataset("layers/dense/vars/0", {1}, &value);
  const std::string bytes = h5.finish();
  CHECK(bytes.compare(0, 8, std::string("\x89HDF\r\n\x1a\n", 8)) == 0);
}
