// The final model opens elsewhere: the tutorial CNN and a small residual network with batch
// normalization (a graph), each trained by a real `dtrain launch` on Fashion-MNIST, loaded into
// PyTorch by examples/pytorch/load_dtrain_model.py, score dtrain's own val_accuracy on the same 10k
// test split, and the character GPT of configs/char-gpt-shakespeare.json scores dtrain's val_loss
// on the text's validation windows; a damaged or unsupported model, or a graph with a cycle or a
// name that names no layer, is refused with exit 2 naming the file or layer. Needs Debian's
// python3-torch (scripts/setup.sh --tests); without it the cases say so and pass.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/main_job.h"
#include "test/support/python.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "worker/train/checkpoint.h"
#include "worker/train/safetensors.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

constexpr const char* kPython = testing::kSystemPython;

bool torch_available() {
  return testing::python_imports("numpy, torch");
}

std::string example() {
  return std::string(DTRAIN_SOURCE_DIR) + "/examples/pytorch/load_dtrain_model.py";
}

testing::ProcessResult run_example(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kPython, example()};
  argv.insert(argv.end(), args.begin(), args.end());
  // A guard, not a bound: scoring the GPT's validation split takes about a minute alone and
  // several beside another training suite on 2 cores (ctest -j2 starts this test first).
  testing::ProcessOptions options;
  options.timeout_seconds = 480;
  return testing::run_process(argv, options);
}

// Runs `dtrain launch` on the job file text in tmp and returns the run folder (tmp/run).
std::string launch(const testing::TempDir& tmp, const std::string& job_text) {
  std::string job = tmp.path() + "/job.json";
  std::ofstream(job) << job_text;
  testing::ProcessOptions options;
  options.timeout_seconds = 480;  // a guard (see run_example)
  auto launched = testing::run_process(
      {testing::binary("dtrain"), "launch", job, "--run-dir", tmp.path() + "/run"}, options);
  INFO(launched.out << launched.err);
  REQUIRE(launched.exit_code == 0);
  return tmp.path() + "/run";
}

// One short two-worker run of the tutorial CNN (1 epoch of 60 steps, validated on the whole test
// split), trained once for all cases; its folder lives until the program ends.
const std::string& trained_run() {
  static std::unique_ptr<testing::TempDir> tmp;
  static std::string run;
  if (!run.empty()) return run;
  tmp = std::make_unique<testing::TempDir>();
  run = launch(*tmp, R"({"job": "interop", "workers": 2, )" + testing::main_job_train(1, 60) + "}");
  return run;
}

// A residual network with batch normalization, as a graph listed out of order (the block before
// the stem it adds to, the output named, two layers without names), with pad, crop and flip in
// front; every kind of layer the example loads but max pooling, flatten and dropout (the CNN's).
// The padding is lopsided and the stem's "same" convolution has stride 2, so a centre crop or a
// "same" pad on the wrong side changes the scores. Two workers, 600 steps of 32 (a few seconds).
constexpr const char* kResNetJob = R"({"job": "interop-resnet", "workers": 2, "train": {
  "model": {"input_shape": [28, 28, 1], "output": "logits", "layers": [
    {"name": "block_conv1", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
     "use_bias": false, "inputs": ["stem_relu"]},
    {"name": "block_bn1", "type": "batch_normalization", "momentum": 0.9},
    {"name": "block_relu", "type": "relu"},
    {"name": "block_conv2", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "block_bn2", "type": "batch_normalization", "scale": false, "momentum": 0.9},
    {"name": "sum", "type": "add", "inputs": ["stem_relu", "block_bn2"]},
    {"type": "relu"},
    {"name": "pool", "type": "global_average_pooling2d"},
    {"type": "batch_normalization", "center": false, "scale": false, "momentum": 0.9},
    {"name": "logits", "type": "dense", "units": 10},
    {"name": "pad", "type": "zero_padding2d", "padding": [[2, 1], [1, 2]], "inputs": ["input"]},
    {"name": "crop", "type": "random_crop", "height": 28, "width": 28},
    {"name": "flip", "type": "random_flip", "mode": "horizontal"},
    {"name": "stem_conv", "type": "conv2d", "filters": 16, "kernel_size": 3, "strides": 2,
     "padding": "same", "use_bias": false},
    {"name": "stem_bn", "type": "batch_normalization"},
    {"name": "stem_relu", "type": "relu"}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9},
  "data": {"source": "idx", "dir": "/usr/share/datasets/fashion-mnist"},
  "per_worker_batch_size": 32, "epochs": 1, "steps_per_epoch": 600, "validation": true,
  "seed": 42}})";

// kResNetJob's run, trained once; its folder lives until the program ends.
const std::string& trained_resnet_run() {
  static std::unique_ptr<testing::TempDir> tmp;
  static std::string run;
  if (!run.empty()) return run;
  tmp = std::make_unique<testing::TempDir>();
  run = launch(*tmp, kResNetJob);
  return run;
}

// configs/char-gpt-shakespeare.json's model, loss, optimizer and data (its schedule too) for 20
// steps of one epoch on its two workers, validated on every window of the text's last tenth; its
// folder lives until the program ends. About a minute on 2 cores.
const std::string& trained_gpt_run() {
  static std::unique_ptr<testing::TempDir> tmp;
  static std::string run;
  if (!run.empty()) return run;
  const std::string source = DTRAIN_SOURCE_DIR;
  auto config = common::JsonDocument::parse(
      common::read_file(source + "/configs/char-gpt-shakespeare.json"), "char-gpt-shakespeare");
  const common::JsonNode train = config.root().at("train");
  REQUIRE(train.at("data").at("path").as_string() == "data/tiny-shakespeare/input.txt");
  tmp = std::make_unique<testing::TempDir>();
  run = launch(*tmp, R"({"job": "interop-gpt", "workers": 2, "train": {"model": )" +
                         train.at("model").dump() + R"(, "loss": )" + train.at("loss").dump() +
                         R"(, "optimizer": )" + train.at("optimizer").dump() +
                         R"(, "data": {"source": "text", "path": ")" + source +
                         R"(/data/tiny-shakespeare/input.txt"}, "per_worker_batch_size": 6,
      "epochs": 1, "steps_per_epoch": 20, "validation": true, "seed": 1337}})");
  return run;
}

// The last line of RUN_DIR/metrics.jsonl.
common::JsonDocument last_metrics(const std::string& run) {
  std::ifstream in(run + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  REQUIRE_FALSE(last.empty());
  return common::JsonDocument::parse(last, run + "/metrics.jsonl");
}

// Checks the example's scores of run against dtrain's last val_accuracy and val_loss there, on
// the whole test split, and that they are those of a trained model.
void check_scores(const std::string& run) {
  auto metrics = last_metrics(run);
  double val_accuracy = metrics.root().at("val_accuracy").as_number(0, 1);
  double val_loss = metrics.root().at("val_loss").as_number(0, 1e9);

  auto result = run_example({run, "--json"});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  auto got = common::JsonDocument::parse(result.out, "load_dtrain_model.py --json");
  double accuracy = got.root().at("accuracy").as_number(0, 1);
  INFO("PyTorch accuracy " << accuracy << ", dtrain val_accuracy " << val_accuracy);
  CHECK(got.root().at("examples").as_int(0, 1 << 30) == 10000);  // the whole test split
  CHECK(std::abs(accuracy - val_accuracy) <= 0.002);
  CHECK(std::abs(got.root().at("loss").as_number(0, 1e9) - val_loss) <= 1e-3);
  CHECK(accuracy > 0.6);  // a trained model, not chance: equal by accident is ruled out
}

// A model folder of model.json (the given text) and a safetensors file of the given JSON header
// and no data (by default no tensors).
std::string write_model_json(const std::string& dir, const std::string& model,
                             std::string header = "{}") {
  fs::create_directories(dir + "/model");
  std::ofstream(dir + "/model/model.json") << model << "\n";
  header.resize((header.size() + 7) / 8 * 8, ' ');  // padded to 8 bytes, as dtrain pads
  REQUIRE(header.size() < 256);
  std::string length(8, '\0');
  length[0] = static_cast<char>(header.size());
  std::ofstream(dir + "/model/model.safetensors", std::ios::binary) << length << header;
  return dir;
}

// A model folder as write_model_json's, of 28x28x1 inputs and the given layers.
std::string write_model(const std::string& dir, const std::string& layers,
                        std::string header = "{}") {
  return write_model_json(dir, R"({"input_shape": [28, 28, 1], "layers": )" + layers + "}",
                          std::move(header));
}

}  // namespace

TEST_CASE("PyTorch loads the tutorial CNN and scores dtrain's val_accuracy on the test split") {
  if (!torch_available()) {
    WARN("skipped: " << kPython << " cannot import torch and numpy (scripts/setup.sh --tests "
                     << "installs python3-torch)");
    return;
  }
  check_scores(trained_run());
}

TEST_CASE("PyTorch loads a residual network with batch normalization, a graph, and scores it") {
  if (!torch_available()) {
    WARN("skipped: " << kPython << " cannot import torch and numpy");
    return;
  }
  const std::string& run = trained_resnet_run();
  check_scores(run);

  // Batch normalization as PyTorch's: momentum 1 - Keras's (training only, so not in the
  // scores), affine=False without gamma and beta, BatchNorm1d on the pooled (flat) features.
  auto printed = run_example({run});
  INFO(printed.out << printed.err);
  REQUIRE(printed.exit_code == 0);
  CHECK_THAT(printed.out, Catch::Contains("(11) sum <- stem_relu, block_bn2"));
  CHECK_THAT(printed.out, Catch::Contains("BatchNorm2d(16, eps=0.001, momentum=0.01, affine=True"));
  CHECK_THAT(printed.out, Catch::Contains("BatchNorm1d(16, eps=0.001, momentum=0.1, affine=False"));
}

TEST_CASE("PyTorch loads the character GPT and scores dtrain's val_loss on the validation split") {
  if (!torch_available()) {
    WARN("skipped: " << kPython << " cannot import torch and numpy");
    return;
  }
  const std::string& run = trained_gpt_run();
  const double val_loss = last_metrics(run).root().at("val_loss").as_number(0, 1e9);
  auto result = run_example({run, "--json"});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  auto got = common::JsonDocument::parse(result.out, "load_dtrain_model.py --json");
  const double loss = got.root().at("loss").as_number(0, 1e9);
  INFO("PyTorch val_loss " << loss << ", dtrain's " << val_loss);
  // Every non-overlapping window of the last 10% of the text's 1,115,394 characters.
  CHECK(got.root().at("examples").as_int(0, 1 << 30) == (1115394 - 1003854 - 1) / 64);
  CHECK(std::abs(loss - val_loss) <= 1e-3);
  CHECK(val_loss < 3.6);  // 20 steps from ln(65) = 4.17: trained, not equal by accident

  // The same split from --text and --validation-split; another split is another loss.
  const std::string text = std::string(DTRAIN_SOURCE_DIR) + "/data/tiny-shakespeare/input.txt";
  auto same = run_example({run, "--json", "--text", text, "--validation-split", "0.1"});
  CHECK(same.out == result.out);
  auto other = run_example({run, "--json", "--text", text, "--validation-split", "0.2"});
  REQUIRE(other.exit_code == 0);
  CHECK(other.out != result.out);

  // The attention in the printed modules; a text of other characters is refused.
  auto printed = run_example({run});
  CHECK_THAT(printed.out, Catch::Contains("SelfAttention(heads=4, key_dim=32, value_dim=32, "
                                          "use_bias=False, causal=True)"));
  testing::TempDir tmp;
  std::ofstream(tmp.path() + "/other.txt") << "not shakespeare\n";
  auto refused = run_example({run, "--text", tmp.path() + "/other.txt"});
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("not the text it was trained on"));
}

TEST_CASE("a model trained under a mixed policy loads as its weights say (fp32), policy noted") {
  if (!torch_available()) {
    WARN("skipped: " << kPython << " cannot import torch and numpy");
    return;
  }
  const std::string& run = trained_run();
  testing::TempDir tmp;
  train::SafetensorsFile file = train::read_safetensors(run + "/model/model.safetensors");
  std::vector<train::TensorView> views;
  for (const auto& [name, t] : file.tensors)
    views.push_back({name, t.shape, t.data.data(), t.data.size()});
  std::string mixed = tmp.path() + "/mixed";
  train::write_final_model(mixed + "/model", views, file.metadata.at("architecture"),
                           "mixed_bfloat16");
  REQUIRE(common::read_file(mixed + "/model/model.json")
              .rfind(R"({"dtype_policy":"mixed_bfloat16",)", 0) == 0);
  auto plain = run_example({run, "--json"});
  auto result = run_example({mixed, "--json"});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out == plain.out);  // the same weights, the same scores

  // model.json and the weights must agree on the policy.
  std::string json = common::read_file(mixed + "/model/model.json");
  json.replace(json.find("mixed_bfloat16"), 14, "mixed_float16");
  std::ofstream(mixed + "/model/model.json", std::ios::trunc) << json;
  auto differs = run_example({mixed});
  CHECK(differs.exit_code == 2);
  CHECK_THAT(differs.err, Catch::Contains("its dtype_policy differs"));
}

TEST_CASE("a damaged or unsupported model is refused with exit 2, naming the file or layer") {
  if (!torch_available()) {
    WARN("skipped: " << kPython << " cannot import torch and numpy");
    return;
  }
  testing::TempDir tmp;

  SECTION("a truncated model.safetensors") {
    const std::string& run = trained_run();
    std::string bad = tmp.path() + "/truncated";
    fs::create_directories(bad + "/model");
    fs::copy_file(run + "/model/model.json", bad + "/model/model.json");
    std::string weights = common::read_file(run + "/model/model.safetensors");
    std::ofstream(bad + "/model/model.safetensors", std::ios::binary)
        << weights.substr(0, weights.size() / 2);
    auto result = run_example({bad});
    INFO(result.out << result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains(bad + "/model/model.safetensors: truncated"));
  }
  SECTION("one changed byte fails the checksum") {
    const std::string& run = trained_run();
    std::string bad = tmp.path() + "/flipped";
    fs::create_directories(bad + "/model");
    fs::copy_file(run + "/model/model.json", bad + "/model/model.json");
    std::string weights = common::read_file(run + "/model/model.safetensors");
    weights[weights.size() - 5] ^= 0x01;
    std::ofstream(bad + "/model/model.safetensors", std::ios::binary) << weights;
    auto result = run_example({bad});
    INFO(result.out << result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.safetensors: checksum mismatch"));
  }
  SECTION("no model folder") {
    auto result = run_example({tmp.path()});
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains(tmp.path() + "/model/model.json: cannot read"));
  }
  SECTION("a layer type it does not know") {
    auto result = run_example({write_model(tmp.path(), R"([{"type": "lstm"}])")});
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.layers[0]: unsupported layer type 'lstm'"));
  }
  SECTION("safetensors metadata that is not an object of strings") {
    auto result = run_example({write_model(tmp.path(), "[]", R"({"__metadata__": [1]})")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("__metadata__ is not an object of strings"));
  }
  SECTION("an architecture in the metadata that is not JSON") {
    auto result = run_example(
        {write_model(tmp.path(), "[]", R"({"__metadata__": {"architecture": "[oops"}})")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.safetensors: its architecture is not JSON"));
  }
  SECTION("a layer that is not an object") {
    auto result = run_example({write_model(tmp.path(), "[1]")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.json: not a dtrain model"));
  }
  SECTION("a shape whose element count overflows 64 bits") {
    auto result = run_example({write_model(
        tmp.path(), "[]",
        R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("tensor w: offsets [0, 0] do not hold shape"));
  }
  SECTION("a tensor the model needs is missing") {
    auto result = run_example(
        {write_model(tmp.path(), R"([{"type": "flatten"}, {"type": "dense", "units": 10}])")});
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.safetensors: has no tensor "
                                           "layers.1.dense.kernel (shape [784, 10])"));
  }
}

TEST_CASE("a graph with a cycle or a name that names no layer is refused with exit 2") {
  if (!torch_available()) {
    WARN("skipped: " << kPython << " cannot import torch and numpy");
    return;
  }
  testing::TempDir tmp;

  SECTION("a cycle, named by its layers") {
    auto result = run_example({write_model(tmp.path(), R"([
        {"name": "a", "type": "relu", "inputs": ["input"]},
        {"name": "b", "type": "add", "inputs": ["a", "c"]},
        {"name": "c", "type": "relu", "inputs": ["b"]},
        {"type": "flatten", "inputs": ["c"]},
        {"type": "dense", "units": 10}])")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.layers[1] ('b'): its inputs lead back to it "
                                           "(the layers form a cycle: b <- c <- b)"));
  }
  SECTION("an input that names no layer") {
    auto result = run_example({write_model(tmp.path(), R"([
        {"name": "stem", "type": "flatten"},
        {"name": "logits", "type": "dense", "units": 10, "inputs": ["stme"]}])")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.layers[1] ('logits'): inputs: no layer is "
                                           "named 'stme'"));
  }
  SECTION("an output that names no layer") {
    auto result = run_example({write_model_json(tmp.path(), R"({"input_shape": [28, 28, 1],
        "layers": [{"type": "flatten"}, {"type": "dense", "units": 10}], "output": "logits"})")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.output: no layer is named 'logits'"));
  }
  SECTION("a layer the output does not use") {
    auto result = run_example({write_model(tmp.path(), R"([
        {"name": "unused", "type": "relu"},
        {"type": "flatten", "inputs": ["input"]},
        {"type": "dense", "units": 10}])")});
    INFO(result.err);
    CHECK(result.exit_code == 2);
    CHECK_THAT(result.err, Catch::Contains("model.layers[0] ('unused'): the output does not use "
                                           "this layer"));
  }
}
