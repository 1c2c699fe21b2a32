// End to end through `dtrain launch` with two real dtrain-workers, worker 1 slowed by the
// test-only DTRAIN_TEST_SLOW_STEP_MS: both report the group's samples/s, but worker 1 reports the
// larger compute time per step and worker 0 the larger all-reduce wait; state.json names worker 1
// the straggler (it is, in 3 progress windows in a row: 20 steps give several) and `dtrain status`
// prints the columns and the straggler line. The sleep (300 ms a step) is long beside anything a
// busy machine does to worker 0's few milliseconds of compute, so the order of the figures holds
// under load (40 ms was within what a busy CI machine can take).
#include <catch2/catch.hpp>
#include <fstream>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;

namespace {

const char* kJob = R"({"job": "straggler", "workers": 2,
 "env": {"DTRAIN_TEST_SLOW_STEP_MS": "1:300"},
 "train": {"model": {"input_shape": [8, 8, 1], "layers": [
   {"type": "flatten"}, {"type": "dense", "units": 16, "activation": "relu"},
   {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": "sgd",
  "data": {"source": "synthetic", "examples": 512, "classes": 4},
  "per_worker_batch_size": 16, "epochs": 1, "steps_per_epoch": 20, "seed": 7,
  "validation": false, "tensorboard": false}})";

double seconds(const common::JsonNode& worker, const char* key) {
  return worker.at("last_progress").at(key).as_number(0, 1e9);
}

}  // namespace

TEST_CASE("a slowed worker computes longest, its peer waits, and status names it straggler") {
  testing::TempDir base;
  std::string job = base.path() + "/job.json", dir = base.path() + "/run";
  std::ofstream(job) << kJob;
  auto r = testing::run_process({testing::binary("dtrain"), "launch", job, "--run-dir", dir},
                                {{}, "", 180, ""});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);

  auto state = common::JsonDocument::parse(common::read_file(dir + "/state.json"), "state");
  const auto& workers = state.root().at("workers").as_array();
  REQUIRE(workers.size() == 2);
  double compute0 = seconds(workers[0], "compute_seconds_per_step");
  double compute1 = seconds(workers[1], "compute_seconds_per_step");
  double wait0 = seconds(workers[0], "wait_seconds_per_step");
  double wait1 = seconds(workers[1], "wait_seconds_per_step");
  INFO("compute " << compute0 << " " << compute1 << ", wait " << wait0 << " " << wait1);
  CHECK(compute1 >= 0.25);  // the 300 ms sleep sits in its compute part
  CHECK(compute1 > 2 * compute0);
  CHECK(wait0 > wait1);  // worker 0 waits for worker 1 in each step's all-reduce
  CHECK(wait0 >= 0.02);
  REQUIRE(state.root().find("straggler"));
  CHECK(state.root().at("straggler").at("task").as_string() == "worker:1");

  auto status = testing::run_process({testing::binary("dtrain"), "status", dir});
  INFO(status.out << status.err);
  REQUIRE(status.exit_code == 0);
  CHECK(status.out.find("compute/st") != std::string::npos);
  CHECK(status.out.find("straggler: worker:1 computes ") != std::string::npos);
}
