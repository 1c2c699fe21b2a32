// Keras 3 model files (worker/spec/keras_model.h): a Sequential of every single-input class and
// a Functional residual model with a projection shortcut, written as Keras writes them
// (keras_fixtures.h), translate into dtrain's graph, as bare JSON and inside a .keras zip, and
// the models built from them run forward; older spellings and absent keys (Keras's defaults)
// read the same; no truncation or flipped byte of a file crashes the reader; dtrain-worker
// trains on `"model": {"keras": FILE}`. The refusals are in test_keras_errors.cc.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "test/train/keras_fixtures.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/keras_model.h"
#include "worker/spec/train_config.h"

using namespace dtrain;
namespace kf = dtrain::testing::keras;

namespace {

train::KerasModel translate(const std::string& json) {
  return train::translate_keras_model(json, "model.json");
}

std::string error_of(const std::string& json) {
  try {
    translate(json);
  } catch (const common::ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// Node i's inputs by name ("input": the model's).
std::vector<std::string> inputs_of(const nn::ModelSpec& spec, size_t i) {
  std::vector<std::string> names;
  for (size_t in : spec.nodes[i].inputs)
    names.push_back(in == nn::NodeSpec::kModelInput ? "input" : spec.nodes[in].name);
  return names;
}

// The model built on the reference backend, run forward on n examples: its logits.
std::vector<float> forward(const nn::ModelSpec& spec, int n) {
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  nn::Model model(spec, *backend, n);
  model.initialize(7);
  std::vector<float> x(spec.input_dims().size() * static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 17) / 8.0f - 1.0f;
  const float* logits = model.forward(x.data(), n, nn::StepKey{3, 0, 0}, true);
  return std::vector<float>(logits, logits + static_cast<size_t>(n) * model.classes());
}

bool all_finite(const std::vector<float>& values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a Keras Sequential of every single-input class becomes a chain", "[keras]") {
  train::KerasModel m = translate(kf::sequential_fixture());
  CHECK(m.model_json ==
        R"({"input_shape":[8,8,1],"layers":[)"
        R"({"name":"conv2d","type":"conv2d","filters":4,"kernel_size":[3,3],"strides":[1,1],)"
        R"("padding":"same","activation":"relu","use_bias":true},)"
        R"({"name":"max_pooling2d","type":"max_pooling2d","pool_size":[2,2],"padding":"valid",)"
        R"("strides":[2,2]},)"
        R"({"name":"conv2d_1","type":"conv2d","filters":6,"kernel_size":[3,3],"strides":[1,1],)"
        R"("padding":"valid","activation":"linear","use_bias":true},)"
        R"({"name":"re_lu","type":"relu"},)"
        R"({"name":"dropout","type":"dropout","rate":0.25},)"
        R"({"name":"flatten","type":"flatten"},)"
        R"({"name":"dense","type":"dense","units":16,"activation":"relu","use_bias":true},)"
        R"({"name":"dense_1","type":"dense","units":3,"activation":"softmax","use_bias":true}]})");
  const nn::ModelSpec& s = m.spec;
  CHECK(s.input_dims() == nn::Dims{1, 8, 8});
  REQUIRE(s.nodes.size() == 8);
  const std::vector<std::string> names = {"conv2d",  "max_pooling2d", "conv2d_1", "re_lu",
                                          "dropout", "flatten",       "dense",    "dense_1"};
  const std::vector<std::string> types = {"conv2d",  "max_pooling2d", "conv2d", "relu",
                                          "dropout", "flatten",       "dense",  "dense"};
  const std::vector<nn::Dims> outs = {{4, 8, 8}, {4, 4, 4},  {6, 2, 2},  {6, 2, 2},
                                      {6, 2, 2}, {24, 1, 1}, {16, 1, 1}, {3, 1, 1}};
  for (size_t i = 0; i < s.nodes.size(); ++i) {
    INFO(i);
    CHECK(s.nodes[i].name == names[i]);
    CHECK(s.nodes[i].type == types[i]);
    CHECK(s.nodes[i].out == outs[i]);
    CHECK(inputs_of(s, i) == std::vector<std::string>{i == 0 ? "input" : names[i - 1]});
  }
  CHECK(s.nodes.back().config->activation() == nn::Activation::kSoftmax);
  CHECK(s.nodes[0].param_prefix == "conv2d.");
  std::vector<float> logits = forward(s, 2);
  CHECK(logits.size() == 6);
  CHECK(all_finite(logits));
}

TEST_CASE("a Keras Functional residual model with a projection shortcut becomes a graph",
          "[keras]") {
  train::KerasModel m = translate(kf::functional_fixture());
  const nn::ModelSpec& s = m.spec;
  CHECK(s.input_dims() == nn::Dims{1, 8, 8});
  REQUIRE(s.nodes.size() == 14);
  struct Want {
    const char* name;
    const char* type;
    std::vector<std::string> inputs;
    nn::Dims out;
  };
  const std::vector<Want> want = {
      {"conv2d", "conv2d", {"input"}, {4, 8, 8}},
      {"conv2d_1", "conv2d", {"conv2d"}, {4, 8, 8}},
      {"conv2d_2", "conv2d", {"conv2d_1"}, {4, 8, 8}},
      {"add", "add", {"conv2d", "conv2d_2"}, {4, 8, 8}},
      {"re_lu", "relu", {"add"}, {4, 8, 8}},
      {"conv2d_3", "conv2d", {"re_lu"}, {8, 4, 4}},
      {"conv2d_4", "conv2d", {"conv2d_3"}, {8, 4, 4}},
      {"conv2d_5", "conv2d", {"re_lu"}, {8, 4, 4}},
      {"add_1", "add", {"conv2d_4", "conv2d_5"}, {8, 4, 4}},
      {"re_lu_1", "relu", {"add_1"}, {8, 4, 4}},
      {"max_pooling2d", "max_pooling2d", {"re_lu_1"}, {8, 2, 2}},
      {"dropout", "dropout", {"max_pooling2d"}, {8, 2, 2}},
      {"flatten", "flatten", {"dropout"}, {32, 1, 1}},
      {"dense", "dense", {"flatten"}, {3, 1, 1}},
  };
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].name);
    CHECK(s.nodes[i].name == want[i].name);
    CHECK(s.nodes[i].type == want[i].type);
    CHECK(inputs_of(s, i) == want[i].inputs);
    CHECK(s.nodes[i].out == want[i].out);
  }
  CHECK(m.model_json.find(R"("output":"dense")") != std::string::npos);
  CHECK(m.model_json.find(R"({"name":"add_1","type":"add","inputs":["conv2d_4","conv2d_5"]})") !=
        std::string::npos);
  std::vector<float> logits = forward(s, 2);
  CHECK(logits.size() == 6);
  CHECK(all_finite(logits));
  // input_layers and output_layers as the list (or dict) the model was built with read the same.
  for (const auto& [in, out] : std::vector<std::pair<std::string, std::string>>{
           {R"([["input_layer", 0, 0]])", R"([["dense", 0, 0]])"},
           {R"({"image": ["input_layer", 0, 0]})", R"({"logits": ["dense", 0, 0]})"}}) {
    CHECK(translate(kf::functional(kf::residual_layers(), in, out)).model_json == m.model_json);
  }
}

TEST_CASE("a Keras ResNet block with batch normalization and augmentation becomes a graph",
          "[keras]") {
  train::KerasModel m = translate(kf::resnet_fixture());
  const nn::ModelSpec& s = m.spec;
  const std::vector<std::pair<std::string, nn::Dims>> want = {
      {"zero_padding2d", {1, 12, 12}},
      {"random_crop", {1, 8, 8}},
      {"random_flip", {1, 8, 8}},
      {"conv2d", {4, 8, 8}},
      {"batch_normalization", {4, 8, 8}},
      {"relu", {4, 8, 8}},
      {"conv2d", {4, 8, 8}},
      {"batch_normalization", {4, 8, 8}},
      {"add", {4, 8, 8}},
      {"relu", {4, 8, 8}},
      {"global_average_pooling2d", {4, 1, 1}},
      {"dense", {3, 1, 1}}};
  REQUIRE(s.nodes.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(s.nodes[i].name);
    CHECK(s.nodes[i].type == want[i].first);
    CHECK(s.nodes[i].out == want[i].second);
  }
  CHECK(inputs_of(s, 8) == std::vector<std::string>{"re_lu", "batch_normalization_1"});
  std::vector<float> logits = forward(s, 2);
  CHECK(logits.size() == 6);
  CHECK(all_finite(logits));
  // A setting dtrain cannot honour is refused, naming the layer, its class and the key.
  std::string renorm = kf::resnet_fixture();
  renorm.replace(renorm.find(R"("renorm": false)"), 15, R"("renorm": true)");
  CHECK_THAT(error_of(renorm), Catch::StartsWith("model.json: layer \"batch_normalization\" "
                                                 "(BatchNormalization): renorm: true is not "));
}

TEST_CASE("Keras model files are read as JSON or as a .keras archive", "[keras]") {
  testing::TempDir dir;
  for (const std::string& fixture : {kf::sequential_fixture(), kf::functional_fixture()}) {
    const std::string want = translate(fixture).model_json;
    common::write_file_atomically(dir.path() + "/model.json", fixture);
    common::write_file_atomically(dir.path() + "/model.keras", kf::keras_archive(fixture));
    CHECK(train::read_keras_model(dir.path() + "/model.json").model_json == want);
    CHECK(train::read_keras_model(dir.path() + "/model.keras").model_json == want);
  }
  // The archive's mistakes name the archive and its config.json.
  auto layers = kf::chain_layers();
  layers[1].config.set("groups", "2");
  common::write_file_atomically(dir.path() + "/bad.keras",
                                kf::keras_archive(kf::sequential(layers)));
  try {
    train::read_keras_model(dir.path() + "/bad.keras");
    FAIL("accepted");
  } catch (const common::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::StartsWith(
                             dir.path() + "/bad.keras: config.json: layer \"conv2d\" (Conv2D): "
                                          "groups: 2 is not supported (dtrain computes 1)"));
  }
}

TEST_CASE("older Keras 3 spellings, seeds and absent keys read as Keras means them", "[keras]") {
  const std::string want = translate(kf::sequential_fixture()).model_json;
  // Keras 3.0-3.3 wrote a layer's dtype as its name and GlorotUniform's config as the seed alone;
  // seeds are accepted (dtrain draws from train.seed); "linear" may be null.
  auto layers = kf::chain_layers();
  for (kf::Layer& l : layers) {
    if (l.class_name == "InputLayer") continue;
    l.config.set("dtype", R"("float32")");
    if (l.class_name == "Conv2D" || l.class_name == "Dense") {
      l.config.set("kernel_initializer",
                   R"({"module": "keras.initializers", "class_name": "GlorotUniform", )"
                   R"("config": {"seed": 42}, "registered_name": null})");
    }
  }
  layers[5].config.set("seed", "1337");
  CHECK(translate(kf::sequential(layers)).model_json == want);
  // A file with only what Keras cannot default: the others take Keras's defaults (valid padding,
  // strides 1, linear, pooling strides = pool_size).
  const char* bare = R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 9, 9, 2]}},
      {"class_name": "Conv2D", "config": {"filters": 3, "kernel_size": [3, 3]}},
      {"class_name": "MaxPooling2D", "config": {}},
      {"class_name": "Flatten", "config": {}},
      {"class_name": "Dense", "config": {"units": 5}}]}})";
  nn::ModelSpec s = translate(bare).spec;
  REQUIRE(s.nodes.size() == 4);
  CHECK(s.input_dims() == nn::Dims{2, 9, 9});
  CHECK(s.nodes[0].out == nn::Dims{3, 7, 7});
  CHECK(s.nodes[0].config->activation() == nn::Activation::kLinear);
  CHECK(s.nodes[1].out == nn::Dims{3, 3, 3});
  CHECK(s.nodes[3].out == nn::Dims{5, 1, 1});
  CHECK(s.nodes[0].name == "layers.0.conv2d");  // no Keras name: dtrain's
}

TEST_CASE("no truncation or flipped byte of a Keras file crashes the reader", "[keras]") {
  std::mt19937 rng(20260821);
  for (const std::string& fixture : {kf::sequential_fixture(), kf::functional_fixture()}) {
    for (size_t n = 0; n < fixture.size(); ++n) {
      CHECK_THROWS_AS(translate(fixture.substr(0, n)), common::ConfigError);
    }
    int accepted = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::string text = fixture;
      const size_t flips = 1 + rng() % 3;
      for (size_t k = 0; k < flips; ++k) text[rng() % text.size()] = static_cast<char>(rng());
      try {
        train::KerasModel m = translate(text);
        CHECK(!m.spec.nodes.empty());  // a valid model, from a flip that kept the JSON meaningful
        ++accepted;
      } catch (const common::ConfigError&) {
      }
    }
    INFO(accepted << " of 400 flipped files accepted");
    CHECK(accepted < 400);
  }
  // The archive: every 16th truncation is refused with the file's name.
  testing::TempDir dir;
  const std::string archive = kf::keras_archive(kf::functional_fixture());
  const std::string path = dir.path() + "/model.keras";
  for (size_t n = 0; n < archive.size(); n += 16) {
    common::write_file_atomically(path, archive.substr(0, n));
    try {
      train::read_keras_model(path);
      FAIL("a truncated archive was read");
    } catch (const common::ConfigError& e) {
      CHECK_THAT(e.what(), Catch::Matchers::StartsWith(path + ": "));
    }
  }
}

TEST_CASE("the example residual model is a Keras Functional that dtrain-worker trains",
          "[keras][worker]") {
  testing::TempDir dir;
  const std::string example =
      common::read_file(std::string(DTRAIN_SOURCE_DIR) + "/examples/keras/resnet_block.json");
  train::KerasModel m = translate(example);
  CHECK(m.spec.input_dims() == nn::Dims{1, 28, 28});
  CHECK(m.spec.output_dims() == nn::Dims{10, 1, 1});
  common::write_file_atomically(dir.path() + "/model.json", example);
  common::write_file_atomically(dir.path() + "/job.json", R"({"job": "keras", "train": {
      "model": {"keras": "model.json"},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "data": {"source": "synthetic", "examples": 64, "classes": 10},
      "per_worker_batch_size": 16, "epochs": 1, "steps_per_epoch": 2, "device": "cpu"}})");
  testing::ProcessOptions options;
  options.cwd = dir.path();  // the model file is relative to the working directory
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", "job.json", "--run-dir", dir.path() + "/run"},
      options);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(std::filesystem::exists(dir.path() + "/run/metrics.jsonl"));
  // The run records the translation as its architecture.
  std::string recorded = common::read_file(dir.path() + "/run/model/model.json");
  CHECK(recorded.find(R"("name":"conv2d_5","type":"conv2d")") != std::string::npos);
}

TEST_CASE("Keras's pooling, activations, regularizers and clipping of issue 44 read and train",
          "[keras][worker]") {
  kf::Layer conv = kf::conv2d("conv2d", 4, "[3, 3]", "[1, 1]", "same", "gelu", "[null, 8, 8, 4]");
  conv.config.set("kernel_regularizer",
                  R"({"module": "keras.regularizers", "class_name": "L2", "config": )"
                  R"({"l2": 0.001}, "registered_name": null})");
  kf::Layer max = kf::max_pooling2d("max_pooling2d", "[null, 2, 2, 4]");
  max.config.set("padding", R"("same")");
  kf::Layer hidden = kf::dense("dense", 8, "tanh", "[null, 8]");
  hidden.config.set("bias_regularizer",
                    R"({"module": "keras.regularizers", "class_name": "L1L2", "config": )"
                    R"({"l1": 0.01, "l2": 0.0}, "registered_name": null})");
  const std::string json = kf::sequential(
      {kf::input_layer("input_layer", "[null, 8, 8, 1]"),
       kf::rescaling("rescaling", "0.5", "-0.25", "[null, 8, 8, 1]"),
       kf::random_translation("random_translation", "0.2", "[-0.1, 0.3]", "[null, 8, 8, 1]"), conv,
       kf::average_pooling2d("average_pooling2d", "[3, 3]", "[2, 2]", "same", "[null, 4, 4, 4]"),
       max, kf::activation("activation", "silu", "[null, 2, 2, 4]"),
       kf::reshape("reshape", "[4, 4, 1]", "[null, 4, 4, 1]"), kf::flatten("flatten", "[null, 16]"),
       hidden, kf::dense("dense_1", 3, "sigmoid", "[null, 3]"),
       kf::dense("dense_2", 3, "linear", "[null, 3]")});
  train::KerasModel m = translate(json);
  const nn::ModelSpec& s = m.spec;
  const std::vector<std::string> types = {"rescaling",     "random_translation",
                                          "conv2d",        "average_pooling2d",
                                          "max_pooling2d", "activation",
                                          "reshape",       "flatten",
                                          "dense",         "dense",
                                          "dense"};
  const std::vector<nn::Dims> outs = {{1, 8, 8}, {1, 8, 8}, {4, 8, 8}, {4, 4, 4},
                                      {4, 2, 2}, {4, 2, 2}, {1, 4, 4}, {16, 1, 1},
                                      {8, 1, 1}, {3, 1, 1}, {3, 1, 1}};
  REQUIRE(s.nodes.size() == types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    INFO(i);
    CHECK(s.nodes[i].type == types[i]);
    CHECK(s.nodes[i].out == outs[i]);
  }
  CHECK(m.model_json.find(R"("kernel_regularizer":{"module":"keras.regularizers","class_name":)"
                          R"("L2","config":{"l2":0.001},"registered_name":null})") !=
        std::string::npos);
  CHECK(all_finite(forward(s, 2)));

  testing::TempDir dir;
  common::write_file_atomically(dir.path() + "/model.json", json);
  common::write_file_atomically(dir.path() + "/job.json", R"({"job": "keras", "train": {
      "model": {"keras": "model.json"},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"type": "adam", "learning_rate": 0.01, "global_clipnorm": 1.0},
      "data": {"source": "synthetic", "examples": 64, "classes": 3},
      "per_worker_batch_size": 16, "epochs": 2, "steps_per_epoch": 2, "device": "cpu"}})");
  testing::ProcessOptions options;
  options.cwd = dir.path();
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", "job.json", "--run-dir", dir.path() + "/run"},
      options);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string metrics = common::read_file(dir.path() + "/run/metrics.jsonl");
  CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 2);  // a line per epoch
}
