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

// Issue 46, item 4: one NaN pixel in a float32 npz made a job "succeed" with NaNs in its kernel.
// TerminateOnNaN: every worker stops at the same point with exit 4 naming what went non-finite,
// the launcher does not restart (the same data would give the same NaN) and the job fails with
// exit 4; no checkpoint or model holding the NaNs is written.
TEST_CASE("a NaN in the data ends the job with exit 4 and no restart (TerminateOnNaN)", "[npy]") {
  testing::TempDir dir;
  REQUIRE(testing::python_imports("numpy"));
  testing::ProcessOptions options;
  options.cwd = dir.path();
  auto made = testing::run_process({testing::kSystemPython, "-c", R"(
import numpy as np
rng = np.random.default_rng(0)
y = np.arange(256) % 4
x = (rng.random((256, 6, 6)) + y[:, None, None]).astype(np.float32)
x[37, 2, 3] = np.nan
np.savez('nan.npz', x_train=x, y_train=y))"},
                                   options);
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  const std::string job = dir.path() + "/job.json";
  std::ofstream(job) << R"({"job": "bad-nan", "workers": 2,
    "restart": {"max_restarts": 3, "backoff_seconds": 0.1},
    "train": {"model": {"input_shape": [6, 6, 1], "layers": [
      {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"},
      {"type": "flatten"}, {"type": "dense", "units": 4}]},
      "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
      "data": {"source": "npz", "path": ")" +
                            dir.path() + R"(/nan.npz"},
      "per_worker_batch_size": 16, "epochs": 2, "tensorboard": false, "validation": false}})";
  options.timeout_seconds = 300;
  const std::string run = dir.path() + "/run";
  auto launched =
      testing::run_process({testing::binary("dtrain"), "launch", job, "--run-dir", run}, options);
  const std::string said = launched.out + launched.err;
  INFO(said);
  CHECK(launched.exit_code == 4);
  CHECK(said.find("TerminateOnNaN") != std::string::npos);
  CHECK(said.find("not restarting") != std::string::npos);
  CHECK(said.find("succeeded") == std::string::npos);
  CHECK(said.find("attempt 1") == std::string::npos);  // no restart
  CHECK_FALSE(std::filesystem::exists(run + "/model/model.safetensors"));
  CHECK_FALSE(std::filesystem::exists(run + "/backup/checkpoint.json"));  // none saved with NaNs
}
