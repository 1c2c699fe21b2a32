// The data and losses Keras takes (issue 46, item 4), through dtrain launch: a tabular MLP on
// (N, F) float64 arrays with one-hot labels and categorical_crossentropy, a regression with
// mean_squared_error and its mae and mse metrics, binary_crossentropy on a sigmoid; each learns
// its task, dtrain evaluate repeats its last validation, and the wrong combinations are exit 2
// naming the key. The formulas and gradients are test/nn/test_target_losses.cc's.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/python.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
using Catch::Matchers::Contains;

namespace {

constexpr double kAny = 1e300;

// Three learnable tasks on 20 float64 features: 3 classes (one-hot), a linear target, 0/1.
constexpr const char* kMakeData = R"PY(
import sys, numpy as np
rng = np.random.default_rng(0)
n, f = 1200, 20
x = rng.normal(size=(n, f))
classes = (x @ rng.normal(size=(f, 3))).argmax(1)
onehot = np.eye(3)[classes]
value = x @ rng.normal(size=f) + 0.1 * rng.normal(size=n)
binary = (x[:, 0] + x[:, 1] > 0).astype(np.float64)
d = sys.argv[1]
for name, y in (('onehot', onehot), ('value', value), ('binary', binary), ('indices', classes)):
    np.savez(f'{d}/{name}.npz', x_train=x[:1000], y_train=y[:1000], x_test=x[1000:], y_test=y[1000:])
)PY";

std::string job_text(const std::string& name, const std::string& data, const std::string& last,
                     const std::string& loss, const std::string& metrics) {
  return R"({"job": ")" + name + R"(", "workers": 2, "restart": {"max_restarts": 0},
    "train": {"model": {"input_shape": [20], "layers": [
        {"type": "dense", "units": 32, "activation": "relu"}, )" +
         last + R"(]},
      "loss": )" +
         loss + R"(, "metrics": )" + metrics +
         R"(, "optimizer": {"type": "adam", "learning_rate": 0.01},
      "data": {"source": "npz", "path": ")" +
         data + R"("}, "per_worker_batch_size": 32, "epochs": 15, "validation": true,
      "seed": 7, "device": "cpu", "tensorboard": false}})";
}

testing::ProcessResult dtrain_run(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::binary("dtrain")};
  argv.insert(argv.end(), args.begin(), args.end());
  testing::ProcessOptions options;
  options.timeout_seconds = 240;
  return testing::run_process(argv, options);
}

// Launches the job; returns its last metrics line.
common::JsonDocument train(const testing::TempDir& dir, const std::string& name,
                           const std::string& job) {
  const std::string path = dir.path() + "/" + name + ".json";
  std::ofstream(path) << job;
  auto r = dtrain_run({"launch", path, "--run-dir", dir.path() + "/" + name});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  std::istringstream lines(common::read_file(dir.path() + "/" + name + "/metrics.jsonl"));
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty()) last = line;
  return common::JsonDocument::parse(last, "metrics.jsonl");
}

common::JsonDocument evaluate(const std::string& run) {
  auto r = dtrain_run({"evaluate", run, "--json"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  return common::JsonDocument::parse(r.out, "dtrain evaluate --json");
}

double number(const common::JsonDocument& doc, const char* key) {
  return doc.root().at(key).as_number(-kAny, kAny);
}

// dtrain-worker alone on a job: its exit code and stderr.
testing::ProcessResult worker(const testing::TempDir& dir, const std::string& job) {
  const std::string path = dir.path() + "/bad.json";
  std::ofstream(path) << job;
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  options.env["TF_CONFIG"] = std::nullopt;
  return testing::run_process(
      {testing::binary("dtrain-worker"), "--config", path, "--run-dir", dir.path() + "/bad"},
      options);
}

}  // namespace

TEST_CASE("Keras's data and losses train: tabular one-hot, regression and binary", "[losses]") {
  if (!testing::python_imports("numpy")) return;
  testing::TempDir dir;
  auto made = testing::run_process({testing::kSystemPython, "-c", kMakeData, dir.path()});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);

  // A tabular MLP, float64 (N, 20) inputs, one-hot labels, categorical cross-entropy.
  common::JsonDocument onehot = train(
      dir, "onehot",
      job_text("onehot", dir.path() + "/onehot.npz",
               R"({"type": "dense", "units": 3, "activation": "softmax"})",
               R"("categorical_crossentropy")", R"(["accuracy", "top_k_categorical_accuracy"])"));
  CHECK(number(onehot, "val_accuracy") > 0.85);
  CHECK(number(onehot, "val_top_k_categorical_accuracy") == 1.0);  // k = 5 of 3 classes
  common::JsonDocument scored = evaluate(dir.path() + "/onehot");
  CHECK(number(scored, "accuracy") == number(onehot, "val_accuracy"));
  CHECK(number(scored, "loss") == Approx(number(onehot, "val_loss")).epsilon(1e-6));

  // A regression: mean squared error, logged with mae (its companion) and the mse metric.
  common::JsonDocument value =
      train(dir, "value",
            job_text("value", dir.path() + "/value.npz", R"({"type": "dense", "units": 1})",
                     R"({"type": "mean_squared_error"})", R"(["mae", "mse"])"));
  // The target's variance is about 20 (20 unit-normal features, unit-normal weights).
  CHECK(number(value, "val_loss") < 2.0);
  CHECK(number(value, "val_mse") == number(value, "val_loss"));
  CHECK(number(value, "mae") > 0);
  CHECK(number(value, "val_mae") > 0);
  CHECK_FALSE(value.root().find("accuracy"));
  common::JsonDocument regression = evaluate(dir.path() + "/value");
  CHECK(number(regression, "mae") == Approx(number(value, "val_mae")).epsilon(1e-6));

  // Both tabular models load into PyTorch (examples/pytorch/load_dtrain_model.py) and give
  // dtrain predict's outputs.
  if (testing::python_imports("numpy, torch")) {
    for (const char* run : {"onehot", "value"}) {
      const std::string out = dir.path() + "/" + run + ".npy";
      auto predicted = dtrain_run({"predict", dir.path() + "/" + run, "--input",
                                   dir.path() + "/" + run + ".npz", "--output", out});
      REQUIRE(predicted.exit_code == 0);
      auto compared =
          testing::run_process({testing::kSystemPython, "-c", R"PY(
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
import load_dtrain_model
model = load_dtrain_model.load_model(sys.argv[2])
model = model[0] if isinstance(model, tuple) else model
x = torch.from_numpy(np.load(sys.argv[3])['x_test'].astype(np.float32))
with torch.no_grad():
    y = model(x).numpy()
ours = np.load(sys.argv[4])
assert y.shape == ours.shape, (y.shape, ours.shape)
print(float(np.abs(y - ours).max()))
)PY",
                                std::string(DTRAIN_SOURCE_DIR) + "/examples/pytorch",
                                dir.path() + "/" + run, dir.path() + "/" + run + ".npz", out});
      INFO(run << ": " << compared.err);
      REQUIRE(compared.exit_code == 0);
      CHECK(std::stod(compared.out) < 1e-4);
    }
  }

  // Binary cross-entropy on a sigmoid.
  common::JsonDocument binary =
      train(dir, "binary",
            job_text("binary", dir.path() + "/binary.npz",
                     R"({"type": "dense", "units": 1, "activation": "sigmoid"})",
                     R"("binary_crossentropy")", R"(["accuracy"])"));
  CHECK(number(binary, "val_accuracy") > 0.85);
}

TEST_CASE("a wrong loss, label or metric for the model is exit 2 naming it", "[losses]") {
  if (!testing::python_imports("numpy")) return;
  testing::TempDir dir;
  auto made = testing::run_process({testing::kSystemPython, "-c", kMakeData, dir.path()});
  REQUIRE(made.exit_code == 0);
  const std::string softmax3 = R"({"type": "dense", "units": 3, "activation": "softmax"})";
  struct Case {
    std::string job, says;
  };
  const Case cases[] = {
      {job_text("a", dir.path() + "/value.npz", softmax3, R"("mean_squared_error")", "[]"),
       "train.loss: a regression loss compares the last layer's values"},
      {job_text("b", dir.path() + "/binary.npz", softmax3, R"("binary_crossentropy")", "[]"),
       "train.loss: binary_crossentropy scores each output on its own"},
      {job_text("c", dir.path() + "/indices.npz", softmax3, R"("categorical_crossentropy")", "[]"),
       "categorical_crossentropy takes one-hot labels of shape (N, classes)"},
      {job_text("d", dir.path() + "/onehot.npz", softmax3, R"("sparse_categorical_crossentropy")",
                "[]"),
       "labels must have shape (N,) or (N, 1), not (1000, 3)"},
      {job_text("e", dir.path() + "/onehot.npz", softmax3, R"("categorical_crossentropy")",
                R"(["auc"])"),
       "train.metrics[0]: \"auc\": not computed by dtrain yet"},
      {job_text("f", dir.path() + "/value.npz", R"({"type": "dense", "units": 1})",
                R"("mean_squared_error")", R"(["accuracy"])"),
       "train.metrics[0]: \"accuracy\": an accuracy needs a classification loss"},
      {job_text("g", dir.path() + "/onehot.npz",
                R"({"type": "dense", "units": 4, "activation": "softmax"})",
                R"("categorical_crossentropy")", "[]"),
       "3 values per example but the model's output has 4"},
  };
  for (const Case& c : cases) {
    auto r = worker(dir, c.job);
    INFO(c.job << "\n" << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains(c.says));
    // dtrain validate opens the data as the workers will, and names the job file.
    auto checked = dtrain_run({"validate", dir.path() + "/bad.json"});
    INFO(checked.out);
    CHECK(checked.exit_code == 2);
    CHECK_THAT(checked.err, Contains(c.says));
    CHECK_THAT(checked.err, Contains(dir.path() + "/bad.json: train."));
  }
  std::ofstream(dir.path() + "/good.json") << job_text("good", dir.path() + "/onehot.npz", softmax3,
                                                       R"("categorical_crossentropy")", "[]");
  auto good = dtrain_run({"validate", dir.path() + "/good.json"});
  INFO(good.err);
  CHECK(good.exit_code == 0);
  CHECK_THAT(good.out, Contains("# data: 1000 examples, 3 target value(s) each (npz) to train, "
                                "200 to validate"));
}
