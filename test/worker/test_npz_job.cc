// dtrain-worker on an .npz data set written by NumPy (issue 27): an archive with no test arrays
// trains when the job does not validate, and is refused (exit 2, naming the missing key) when it
// does. The readers themselves are test/data's.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "test/support/python.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;

TEST_CASE("dtrain-worker trains on an npz without test arrays when validation is off", "[npy]") {
  testing::TempDir dir;
  if (!testing::python_imports("numpy")) {
    WARN("skipped: " << testing::kSystemPython << " cannot import numpy");
    return;
  }
  testing::ProcessOptions options;
  options.cwd = dir.path();
  auto made = testing::run_process({testing::kSystemPython, "-c", R"(
import numpy as np
rng = np.random.default_rng(0)
y = np.arange(256) % 4
x = (rng.random((256, 6, 6)) * 60 + y[:, None, None] * 60).astype(np.uint8)
np.savez_compressed('data.npz', x_train=x, y_train=y))"},
                                   options);
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  auto job = [&](bool validation) {
    const std::string path = dir.path() + (validation ? "/val.json" : "/job.json");
    std::ofstream(path) << R"({"model": {"input_shape": [6, 6], "layers": [{"type": "flatten"},
      {"type": "dense", "units": 4}]},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "data": {"source": "npz", "path": ")" +
                               dir.path() + R"(/data.npz"},
      "per_worker_batch_size": 32, "epochs": 1, "tensorboard": false, "validation": )"
                        << (validation ? "true" : "false") << "}";
    return path;
  };
  options.timeout_seconds = 120;
  options.env["TF_CONFIG"] = std::nullopt;
  auto run = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", job(false), "--run-dir", dir.path() + "/run"},
      options);
  INFO(run.out << run.err);
  CHECK(run.exit_code == 0);
  CHECK(std::filesystem::exists(dir.path() + "/run/model/model.safetensors"));
  CHECK((run.out + run.err).find("256 training examples") != std::string::npos);

  auto refused = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", job(true), "--run-dir", dir.path() + "/run2"},
      options);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find(dir.path() + "/data.npz: x_test: no such array in the archive (it has: "
                                      "x_train, y_train)") != std::string::npos);
}
