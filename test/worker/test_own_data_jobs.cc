// Users' own data through dtrain launch and dtrain-worker (issue 27): Fashion-MNIST as an npz
// trains two workers to the IDX source's model bit for bit, and sharded by file; a folder of
// PNGs trains with validation_split and names its classes in model.json and its checkpoints;
// every kind of bad data is exit 2 naming the file or key. The readers themselves are
// test/data's.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "test/support/python.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "worker/train/safetensors.h"

using namespace dtrain;
using Catch::Matchers::Contains;

namespace {

constexpr const char* kFashion = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST's IDX files as Keras's npz (uint8 images, uint8 labels).
constexpr const char* kToNpz = R"PY(
import gzip, sys, numpy as np
src, out = sys.argv[1], sys.argv[2]
def idx(name, offset):
    return np.frombuffer(gzip.open(f'{src}/{name}-ubyte.gz').read(), np.uint8, offset=offset)
np.savez(out, x_train=idx('train-images-idx3', 16).reshape(-1, 28, 28),
         y_train=idx('train-labels-idx1', 8), x_test=idx('t10k-images-idx3', 16).reshape(-1, 28, 28),
         y_test=idx('t10k-labels-idx1', 8))
)PY";

// Launches a job of `workers` on data; more_train (`"key": value, ` text) adds train keys.
std::string launch(const testing::TempDir& dir, const std::string& name, const std::string& data,
                   int workers = 2, const std::string& more_train = "") {
  const std::string job = dir.path() + "/" + name + ".json", run = dir.path() + "/" + name;
  std::ofstream(job) << R"({"job": ")" << name << R"(", "workers": )" << workers
                     << R"(, "restart": {"max_restarts": 0},
      "train": {)" << more_train
                     << R"("model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"},
        {"type": "dense", "units": 32, "activation": "relu"}, {"type": "dense", "units": 10}]},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9},
      "data": )" << data
                     << R"(, "per_worker_batch_size": 32, "epochs": 1,
      "steps_per_epoch": 25, "seed": 5, "device": "cpu", "tensorboard": false}})";
  testing::ProcessOptions options;
  options.timeout_seconds = 180;
  auto r =
      testing::run_process({testing::binary("dtrain"), "launch", job, "--run-dir", run}, options);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  return run;
}

}  // namespace

TEST_CASE("Fashion-MNIST as an npz trains two workers to the IDX source's model", "[own-data]") {
  if (!testing::python_imports("numpy")) return;
  testing::TempDir dir;
  const std::string npz = dir.path() + "/fashion.npz";
  auto made = testing::run_process({testing::kSystemPython, "-c", kToNpz, kFashion, npz});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  std::string idx = launch(dir, "idx", R"({"source": "idx"})");
  std::string from_npz = launch(dir, "npz", R"({"source": "npz", "path": ")" + npz + R"("})");
  CHECK(common::read_file(idx + "/model/model.safetensors") ==
        common::read_file(from_npz + "/model/model.safetensors"));
  // Sharded by file each worker keeps its own rows: another order, so another model, trained.
  std::string file =
      launch(dir, "file", R"({"source": "npz", "path": ")" + npz + R"(", "shard_policy": "file"})");
  CHECK(common::read_file(file + "/model/model.safetensors") !=
        common::read_file(idx + "/model/model.safetensors"));
  CHECK(common::read_file(file + "/logs/worker-1.log").find("training examples") !=
        std::string::npos);
}

TEST_CASE("a folder of PNGs trains with validation_split and names its classes", "[own-data]") {
  if (!testing::python_imports("PIL")) return;
  testing::TempDir dir;
  auto made = testing::run_process({testing::kSystemPython, "-c", R"PY(
import os, sys
from PIL import Image
for c, name in enumerate(['boot', 'coat']):
    os.makedirs(f'{sys.argv[1]}/imgs/{name}')
    for i in range(40):
        Image.new('L', (28, 28), 60 + 120 * c + i % 7).save(f'{sys.argv[1]}/imgs/{name}/{i}.png')
)PY",
                                    dir.path()});
  REQUIRE(made.exit_code == 0);
  std::string run = launch(dir, "folder",
                           R"({"source": "directory", "train_dir": ")" + dir.path() +
                               R"(/imgs", "color_mode": "grayscale", "validation_split": 0.25,
                               "shard_policy": "file", "seed": 3})",
                           2, R"("backup": {"delete_on_success": false}, )");
  std::string model = common::read_file(run + "/model/model.json");
  CHECK_THAT(model, Contains(R"("class_names":["boot","coat"])"));
  // The checkpoints record them too, as docs/train-config.md says (issue 43, item 23).
  std::string checkpoint;
  for (const auto& entry : std::filesystem::directory_iterator(run + "/backup"))
    if (entry.path().extension() == ".safetensors") checkpoint = entry.path().string();
  REQUIRE_FALSE(checkpoint.empty());
  CHECK(train::read_safetensors_metadata(checkpoint)["class_names"] == R"(["boot","coat"])");
  CHECK(train::read_safetensors_metadata(run + "/model/model.safetensors")["class_names"] ==
        R"(["boot","coat"])");
  CHECK_THAT(common::read_file(run + "/metrics.jsonl"), Contains("input_wait_seconds"));
}

TEST_CASE("bad data is exit 2 naming the file or key and what is wrong", "[own-data]") {
  if (!testing::python_imports("numpy, PIL")) return;
  testing::TempDir dir;
  auto made = testing::run_process({testing::kSystemPython, "-c", R"PY(
import os, sys, numpy as np
from PIL import Image
d = sys.argv[1]
x = np.zeros((20, 28, 28), np.uint8); y = np.arange(20) % 2
np.savez(f'{d}/counts.npz', x_train=x, y_train=y[:19])
np.savez(f'{d}/label.npz', x_train=x, y_train=np.where(np.arange(20) == 13, 12, y))
np.savez(f'{d}/dtype.npz', x_train=x.astype(np.int32), y_train=y)
for name in ('truncated', 'empty', 'mixed'):
    for c in ('a', 'b'):
        os.makedirs(f'{d}/{name}/{c}')
for c in ('a', 'b'):
    for i in range(3):
        Image.new('L', (28, 28), i).save(f'{d}/truncated/{c}/{i}.png')
        Image.new('L', (28, 28), i).save(f'{d}/mixed/{c}/{i}.png')
Image.new('L', (28, 28), 0).save(f'{d}/empty/a/0.png')
Image.new('L', (28, 27), 0).save(f'{d}/mixed/b/9.png')
whole = open(f'{d}/truncated/b/1.png', 'rb').read()
open(f'{d}/truncated/b/1.png', 'wb').write(whole[:len(whole) // 2])
)PY",
                                    dir.path()});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  const std::string d = dir.path();
  struct Case {
    std::string data, expected;
  };
  const std::vector<Case> cases = {
      {R"({"source": "npz", "path": ")" + d + R"(/counts.npz"})", "x_train"},
      {R"({"source": "npz", "path": ")" + d + R"(/label.npz"})",
       d + "/label.npz: y_train: label 12 (example 13) is outside the model's 10 classes"},
      {R"({"source": "npz", "path": ")" + d + R"(/dtype.npz"})", "x_train: dtype '<i4'"},
      {R"({"source": "directory", "color_mode": "grayscale", "train_dir": ")" + d +
           R"(/truncated"})",
       d + "/truncated/b/1.png"},
      {R"({"source": "directory", "color_mode": "grayscale", "train_dir": ")" + d + R"(/empty"})",
       d + "/empty"},
      {R"({"source": "directory", "color_mode": "grayscale", "train_dir": ")" + d + R"(/mixed"})",
       d + "/mixed/b/9.png"},
  };
  int n = 0;
  for (const Case& c : cases) {
    INFO(c.data);
    const std::string job = d + "/bad" + std::to_string(n++) + ".json";
    std::ofstream(job) << R"({"model": {"input_shape": [28, 28, 1], "layers": [{"type": "flatten"},
      {"type": "dense", "units": 10}]},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "data": )" << c.data
                       << R"(, "epochs": 1, "tensorboard": false})";
    testing::ProcessOptions options;
    options.env["TF_CONFIG"] = std::nullopt;
    auto r = testing::run_process(
        {testing::binary("dtrain-worker"), "--config", job, "--run-dir", job + ".run"}, options);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains(c.expected));
  }
}
