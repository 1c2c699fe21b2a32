// `dtrain evaluate` and `dtrain predict` (worker/train/inference.h) on runs dtrain launch trained:
// an npz run (float64 images, as `x / 255.0` makes them) and a folder-of-PNGs run. evaluate prints
// the run's last val_loss and val_accuracy on its own validation data and on the same data named
// with --data; predict's outputs give that accuracy again when their arg-max is scored against
// the labels (in Python, reading the .npy and the CSV). Bad arguments are exit 2 naming them.
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

testing::ProcessResult dtrain_run(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::binary("dtrain")};
  argv.insert(argv.end(), args.begin(), args.end());
  testing::ProcessOptions options;
  options.timeout_seconds = 180;
  return testing::run_process(argv, options);
}

// Launches job (the text of a job file) as dir/<name>.json; returns the run directory.
std::string launch(const testing::TempDir& dir, const std::string& name, const std::string& job) {
  const std::string path = dir.path() + "/" + name + ".json", run = dir.path() + "/" + name;
  std::ofstream(path) << job;
  auto r = dtrain_run({"launch", path, "--run-dir", run});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  return run;
}

// The last line of the run's metrics.jsonl.
common::JsonDocument last_epoch(const std::string& run) {
  std::istringstream lines(common::read_file(run + "/metrics.jsonl"));
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty()) last = line;
  return common::JsonDocument::parse(last, "metrics.jsonl");
}

common::JsonDocument evaluate_json(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"evaluate"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  auto r = dtrain_run(argv);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  return common::JsonDocument::parse(r.out, "dtrain evaluate --json");
}

// The accuracy a Python script prints, as a double.
double python_number(const std::string& script, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::kSystemPython, "-c", script};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = testing::run_process(argv);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return std::stod(r.out);
}

constexpr const char* kModel =
    R"("model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"},
        {"type": "dense", "units": 32, "activation": "relu"},
        {"type": "dense", "units": 4, "activation": "softmax"}]},
      "loss": "sparse_categorical_crossentropy",
      "optimizer": {"type": "adam", "learning_rate": 0.01},
      "per_worker_batch_size": 16, "epochs": 2, "validation": true, "seed": 4,
      "device": "cpu", "tensorboard": false)";

}  // namespace

TEST_CASE("dtrain evaluate and predict on an npz run give the run's val_accuracy", "[evaluate]") {
  if (!testing::python_imports("numpy")) return;
  testing::TempDir dir;
  // Four classes of noisy stripes, float64 in [0, 1]; 600 to train, 150 to test.
  auto made = testing::run_process({testing::kSystemPython, "-c", R"PY(
import sys, numpy as np
rng = np.random.default_rng(1)
def split(n):
    y = rng.integers(0, 4, n)
    x = rng.random((n, 28, 28)) * 0.8
    for i, c in enumerate(y):
        x[i, :, c * 7:(c + 1) * 7] += 0.5 * rng.random()
    return np.clip(x, 0, 1), y
xt, yt = split(600); xv, yv = split(150)
np.savez(sys.argv[1] + '/data.npz', x_train=xt, y_train=yt, x_test=xv, y_test=yv)
np.savez(sys.argv[1] + '/other.npz', x=xv[:50], y=yv[:50])
np.save(sys.argv[1] + '/x.npy', xv.astype(np.float32))
np.save(sys.argv[1] + '/y.npy', yv)
)PY",
                                    dir.path()});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  const std::string run =
      launch(dir, "npz",
             R"({"job": "npz", "workers": 2, "train": {)" + std::string(kModel) +
                 R"(, "data": {"source": "npz", "path": ")" + dir.path() + R"(/data.npz"}}})");
  common::JsonDocument epoch = last_epoch(run);
  const double val_loss = epoch.root().at("val_loss").as_number(-1e300, 1e300);
  const double val_accuracy = epoch.root().at("val_accuracy").as_number(-1e300, 1e300);

  common::JsonDocument own = evaluate_json({run});
  CHECK(own.root().at("examples").as_int(0, 1 << 30) == 150);
  CHECK(own.root().at("accuracy").as_number(-1e300, 1e300) == val_accuracy);
  CHECK(own.root().at("loss").as_number(-1e300, 1e300) == Approx(val_loss).epsilon(1e-6));
  common::JsonDocument named = evaluate_json({run, "--data", dir.path() + "/data.npz"});
  CHECK(named.root().at("accuracy").as_number(-1e300, 1e300) == val_accuracy);
  common::JsonDocument npy =
      evaluate_json({run, "--data", dir.path() + "/x.npy", "--labels", dir.path() + "/y.npy"});
  CHECK(npy.root().at("accuracy").as_number(-1e300, 1e300) == val_accuracy);
  common::JsonDocument other = evaluate_json({run, "--data", dir.path() + "/other.npz"});
  CHECK(other.root().at("examples").as_int(0, 1 << 30) == 50);

  // The words: the examples, then Keras's "loss: ... - accuracy: ...".
  auto words = dtrain_run({"evaluate", run});
  CHECK(words.exit_code == 0);
  CHECK_THAT(words.out, Contains("150 examples: loss: "));
  CHECK_THAT(words.out, Contains(" - accuracy: "));

  // predict: probabilities whose arg-max scores the run's val_accuracy.
  auto predicted = dtrain_run(
      {"predict", run, "--input", dir.path() + "/data.npz", "--output", dir.path() + "/p.npy"});
  INFO(predicted.out << predicted.err);
  REQUIRE(predicted.exit_code == 0);
  CHECK_THAT(predicted.out, Contains("150 examples x 4 outputs"));
  const double from_npy = python_number(R"PY(
import sys, numpy as np
p = np.load(sys.argv[1]); y = np.load(sys.argv[2])
assert p.shape == (150, 4) and p.dtype == np.float32, (p.shape, p.dtype)
assert np.allclose(p.sum(1), 1, atol=1e-5)
print(float((p.argmax(1) == y).mean()))
)PY",
                                        {dir.path() + "/p.npy", dir.path() + "/y.npy"});
  CHECK(from_npy == Approx(val_accuracy).margin(1e-9));
  predicted = dtrain_run(
      {"predict", run, "--input", dir.path() + "/x.npy", "--output", dir.path() + "/p.csv"});
  REQUIRE(predicted.exit_code == 0);
  const double from_csv = python_number(R"PY(
import csv, sys, numpy as np
rows = list(csv.reader(open(sys.argv[1])))
assert rows[0][:2] == ['input', 'predicted'] and len(rows[0]) == 6, rows[0]
y = np.load(sys.argv[2])
print(float(np.mean([r[1] == f'class_{y[int(r[0])]}' for r in rows[1:]])))
)PY",
                                        {dir.path() + "/p.csv", dir.path() + "/y.npy"});
  CHECK(from_csv == Approx(val_accuracy).margin(1e-9));

  // Bad arguments: exit 2, naming what is wrong; no output file left behind.
  auto bad = dtrain_run({"evaluate", run, "--data", dir.path() + "/missing.npz"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("missing.npz"));
  bad = dtrain_run({"evaluate", run, "--data", dir.path() + "/x.npy"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("--labels"));
  bad = dtrain_run(
      {"predict", run, "--input", dir.path() + "/x.npy", "--output", dir.path() + "/p.txt"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains(".npy or .csv"));
  bad = dtrain_run(
      {"predict", run, "--input", dir.path() + "/y.npy", "--output", dir.path() + "/bad.npy"});
  CHECK(bad.exit_code == 2);
  CHECK_FALSE(std::ifstream(dir.path() + "/bad.npy").good());
  bad = dtrain_run({"evaluate", dir.path() + "/no-such-run"});
  CHECK(bad.exit_code == 2);
}

TEST_CASE("dtrain evaluate and predict on a folder-of-PNGs run name its classes", "[evaluate]") {
  if (!testing::python_imports("numpy, PIL")) return;
  testing::TempDir dir;
  auto made = testing::run_process({testing::kSystemPython, "-c", R"PY(
import os, sys, numpy as np
from PIL import Image
rng = np.random.default_rng(2)
for split, n in (('train', 60), ('test', 20)):
    for c, name in enumerate(['boot', 'coat', 'dress', 'shirt']):
        os.makedirs(f'{sys.argv[1]}/{split}/{name}')
        for i in range(n):
            x = rng.random((28, 28)) * 120
            x[:, c * 7:(c + 1) * 7] += 100 * rng.random()
            Image.fromarray(x.astype(np.uint8)).save(f'{sys.argv[1]}/{split}/{name}/{i:03}.png')
)PY",
                                    dir.path()});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  const std::string run = launch(
      dir, "folder",
      R"({"job": "folder", "workers": 2, "train": {)" + std::string(kModel) +
          R"(, "data": {"source": "directory", "train_dir": ")" + dir.path() +
          R"(/train", "test_dir": ")" + dir.path() + R"(/test", "color_mode": "grayscale"}}})");
  const double val_accuracy = last_epoch(run).root().at("val_accuracy").as_number(-1e300, 1e300);
  CHECK(evaluate_json({run}).root().at("accuracy").as_number(-1e300, 1e300) == val_accuracy);
  common::JsonDocument named = evaluate_json({run, "--data", dir.path() + "/test"});
  CHECK(named.root().at("accuracy").as_number(-1e300, 1e300) == val_accuracy);
  CHECK(named.root().at("examples").as_int(0, 1 << 30) == 80);

  auto predicted = dtrain_run(
      {"predict", run, "--input", dir.path() + "/test", "--output", dir.path() + "/p.csv"});
  INFO(predicted.out << predicted.err);
  REQUIRE(predicted.exit_code == 0);
  // Each line names its file, whose folder is its class.
  const double from_csv = python_number(R"PY(
import csv, os, sys
rows = list(csv.reader(open(sys.argv[1])))
assert rows[0] == ['input', 'predicted', 'boot', 'coat', 'dress', 'shirt'], rows[0]
assert len(rows) == 81
print(sum(os.path.basename(os.path.dirname(r[0])) == r[1] for r in rows[1:]) / 80)
)PY",
                                        {dir.path() + "/p.csv"});
  CHECK(from_csv == Approx(val_accuracy).margin(1e-9));
  // One image file: one line.
  predicted = dtrain_run({"predict", run, "--input", dir.path() + "/test/coat/003.png", "--output",
                          dir.path() + "/one.csv"});
  REQUIRE(predicted.exit_code == 0);
  CHECK_THAT(common::read_file(dir.path() + "/one.csv"), Contains("/test/coat/003.png,"));
  // An image of another size: exit 2 naming both shapes.
  auto bad = testing::run_process({testing::kSystemPython, "-c",
                                   "import sys; from PIL import Image; "
                                   "Image.new('L', (32, 32)).save(sys.argv[1])",
                                   dir.path() + "/big.png"});
  REQUIRE(bad.exit_code == 0);
  bad = dtrain_run(
      {"predict", run, "--input", dir.path() + "/big.png", "--output", dir.path() + "/b.csv"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("32x32x1"));
}
