// A Keras 3 Functional miniature GPT (examples/keras/char_gpt.json: keras_hub's
// TokenAndPositionEmbedding, LayerNormalization, MultiHeadAttention called as causal
// self-attention, Add, Dense on sequences) is configs/char-gpt-shakespeare.json's model: the same
// parameters by name, shape and count, and the same logits from the same seed; dtrain-worker
// trains it on tiny-shakespeare from "model": {"keras": FILE} to a lower loss, and
// examples/keras/char-gpt-job.json is that config with the Keras file as its model. The
// refusals of its call arguments are in test_keras_errors.cc, its model.keras in
// test_keras_archive.cc.
#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/keras_model.h"
#include "worker/spec/model_spec.h"
#include "worker/train/model_tensors.h"

using namespace dtrain;

namespace {

const std::string kSource = DTRAIN_SOURCE_DIR;

std::string source_file(const std::string& path) {
  return common::read_file(kSource + "/" + path);
}

// A parameter as the tests compare them.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  size_t count;
  bool operator==(const Param& o) const {
    return name == o.name && shape == o.shape && count == o.count;
  }
};

std::vector<Param> params_of(nn::Model& model) {
  train::ModelTensors tensors(model, {});
  std::vector<Param> out;
  for (const train::TensorView& t : tensors.download()) out.push_back({t.name, t.shape, t.count});
  return out;
}

// The model's logits for two windows of token ids, initialised from seed 1337.
std::vector<float> logits_of(nn::Model& model, int n) {
  model.initialize(1337);
  std::vector<float> ids(static_cast<size_t>(n) * 64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 29 + 3) % 65);
  const float* y = model.forward(ids.data(), n, nn::StepKey{}, false);
  return std::vector<float>(y, y + static_cast<size_t>(n) * model.positions() * model.classes());
}

// Each epoch's "loss" in metrics.jsonl.
std::vector<double> epoch_losses(const std::string& run) {
  std::vector<double> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    common::JsonDocument d = common::JsonDocument::parse(line, "metrics.jsonl");
    out.push_back(d.root().at("loss").as_number(0, 1e9));
  }
  return out;
}

}  // namespace

TEST_CASE("the Keras miniature GPT is configs/char-gpt-shakespeare.json's model", "[keras][gpt]") {
  const train::KerasModel keras = train::translate_keras_model(
      source_file("examples/keras/char_gpt.json"), "examples/keras/char_gpt.json");
  common::JsonDocument config = common::JsonDocument::parse(
      source_file("configs/char-gpt-shakespeare.json"), "char-gpt-shakespeare.json");
  const nn::ModelSpec spec = nn::parse_model_spec(config.root().at("train").at("model"));

  CHECK(keras.spec.input_dims() == spec.input_dims());  // [null, 64] of int32: 64 token ids
  REQUIRE(keras.spec.nodes.size() == spec.nodes.size());
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    INFO(spec.nodes[i].name);
    CHECK(keras.spec.nodes[i].name == spec.nodes[i].name);
    CHECK(keras.spec.nodes[i].type == spec.nodes[i].type);
    CHECK(keras.spec.nodes[i].inputs == spec.nodes[i].inputs);
    CHECK(keras.spec.nodes[i].out == spec.nodes[i].out);
  }
  // Each attention layer's call (use_causal_mask=True) arrives as the layer's key.
  size_t causal = 0;
  for (size_t at = 0;
       (at = keras.model_json.find(R"("use_causal_mask":true)", at)) != std::string::npos; ++at)
    ++causal;
  CHECK(causal == 4);

  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  nn::Model from_keras(keras.spec, *backend, 2), from_config(spec, *backend, 2);
  const std::vector<Param> params = params_of(from_keras);
  CHECK(params == params_of(from_config));
  size_t count = 0;
  for (const Param& p : params) count += p.count;
  // 65 x 128 + 64 x 128 tables; per block 4 x 128 x 128 attention, 2 x 128 x 512 MLP and two
  // gammas; a final gamma and the 128 x 65 head.
  CHECK(count ==
        65 * 128 + 64 * 128 + 4 * (4 * 128 * 128 + 2 * 128 * 512 + 2 * 128) + 128 + 128 * 65);
  CHECK(params[0].name == "embed.token_embedding.embeddings");
  CHECK(params[2].name == "b0_norm1.gamma");
  CHECK(params[3].name == "b0_attention.query.kernel");
  CHECK(params[3].shape == std::vector<int64_t>{128, 4, 32});
  // The same computation (causal attention, no beta, no biases): the same logits, bit for bit.
  CHECK(logits_of(from_keras, 2) == logits_of(from_config, 2));
}

TEST_CASE("examples/keras/char-gpt-job.json is the config with the Keras file as its model",
          "[keras][gpt]") {
  common::JsonDocument example = common::JsonDocument::parse(
      source_file("examples/keras/char-gpt-job.json"), "char-gpt-job.json");
  common::JsonDocument config = common::JsonDocument::parse(
      source_file("configs/char-gpt-shakespeare.json"), "char-gpt-shakespeare.json");
  CHECK(example.root().at("train").at("model").dump() ==
        R"({"keras":"examples/keras/char_gpt.json"})");
  std::vector<std::pair<std::string, common::JsonNode>> a = example.root().at("train").as_object(),
                                                        b = config.root().at("train").as_object();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].first == b[i].first);
    if (a[i].first != "model") CHECK(a[i].second.dump() == b[i].second.dump());
  }
}

TEST_CASE("dtrain-worker trains the Keras miniature GPT on tiny-shakespeare to a lower loss",
          "[keras][gpt][worker]") {
  testing::TempDir dir;
  common::write_file_atomically(dir.path() + "/char_gpt.json",
                                source_file("examples/keras/char_gpt.json"));
  common::write_file_atomically(dir.path() + "/job.json", R"({"job": "keras-gpt", "train": {
      "model": {"keras": "char_gpt.json"},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"type": "adamw", "learning_rate": 0.002, "beta_2": 0.99,
                    "weight_decay": 0.1, "exclude_from_weight_decay": ["gamma"]},
      "data": {"source": "text", "path": ")" + kSource +
                                                              R"(/data/tiny-shakespeare/input.txt"},
      "per_worker_batch_size": 8, "epochs": 3, "steps_per_epoch": 8, "seed": 1337,
      "device": "cpu"}})");
  testing::ProcessOptions options;
  options.cwd = dir.path();       // the model file is relative to the working directory
  options.timeout_seconds = 480;  // about 100 s on 2 shared cores
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", "job.json", "--run-dir", dir.path() + "/run"},
      options);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> losses = epoch_losses(dir.path() + "/run");
  REQUIRE(losses.size() == 3);
  INFO("losses " << losses[0] << " " << losses[1] << " " << losses[2]);
  CHECK(losses[0] > 3.0);  // about ln 65 = 4.17 at the start
  CHECK(losses[2] < losses[0] - 0.3);
  // The run records the translation, attention layers causal, as its architecture.
  const std::string recorded = common::read_file(dir.path() + "/run/model/model.json");
  CHECK(recorded.find(R"("name":"b3_attention","type":"multi_head_attention")") !=
        std::string::npos);
}
