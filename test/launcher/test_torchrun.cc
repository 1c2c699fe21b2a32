// An unchanged PyTorch DDP program (examples/pytorch/ddp_checkpoint.py: gloo, env://, its own
// checkpoints) under `dtrain launch`: it sees torchrun's variables, and a run whose rank 1 is
// SIGKILLed mid-run restarts, resumes from the program's checkpoint and ends with the same
// weights as an undisturbed run. Needs Debian's python3-torch (scripts/setup.sh --tests);
// without it the cases say so and pass.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/python.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

constexpr const char* kPython = testing::kSystemPython;

bool torch_available() {
  return testing::python_imports("torch.distributed");
}

// A two-worker `command` job running the DDP example; its checkpoints and result go to dir/ddp.
std::string write_job(const std::string& dir, int steps, double step_seconds) {
  fs::create_directories(dir + "/ddp");
  std::string script = std::string(DTRAIN_SOURCE_DIR) + "/examples/pytorch/ddp_checkpoint.py";
  std::string job = dir + "/job.json";
  std::ofstream(job) << R"({"job": "ddp", "workers": 2,
    "restart": {"max_restarts": 2, "backoff_seconds": 0.1, "grace_seconds": 5},
    "hang_timeout_seconds": 120,
    "env": {"GLOO_SOCKET_IFNAME": "lo"},
    "command": [")" << kPython
                     << R"(", ")" << script << R"(", "--dir", ")" << dir << R"(/ddp", "--steps", ")"
                     << steps << R"(", "--step-seconds", ")" << step_seconds << R"("]})";
  return job;
}

std::string result_hash(const std::string& dir) {
  auto doc = common::JsonDocument::parse(common::read_file(dir + "/ddp/result.json"), "result");
  return doc.root().at("sha256").as_string();
}

int worker_pid(const std::string& run, int index) {
  auto state = common::JsonDocument::parse(common::read_file(run + "/state.json"), "state");
  return static_cast<int>(
      state.root().at("workers").as_array()[index].at("pid").as_int(1, int64_t{1} << 30));
}

}  // namespace

TEST_CASE("a PyTorch DDP program killed mid-run restarts, resumes and ends as an undisturbed one") {
  if (!torch_available()) {
    WARN("skipped: " << kPython << " cannot import torch (scripts/setup.sh --tests installs "
                     << "python3-torch)");
    return;
  }
  testing::TempDir tmp;
  const int steps = 120;
  testing::ProcessOptions options;
  options.timeout_seconds = 180;

  std::string calm = tmp.path() + "/calm";
  auto undisturbed = testing::run_process({testing::binary("dtrain"), "launch",
                                           write_job(calm, steps, 0.0), "--run-dir", calm + "/run"},
                                          options);
  INFO(undisturbed.out << undisturbed.err);
  REQUIRE(undisturbed.exit_code == 0);
  std::string log0 = common::read_file(calm + "/run/logs/worker-0.log");
  // torchrun's variables as the program checked them against its process group.
  CHECK(std::regex_search(log0, std::regex(R"(rank 0/2: LOCAL_RANK=0 MASTER=localhost:\d+ )"
                                           R"(RESTART_COUNT=0 MAX_RESTARTS=2 RUN_ID=ddp)")));
  CHECK(common::read_file(calm + "/run/logs/worker-1.log").find("rank 1/2: LOCAL_RANK=1") !=
        std::string::npos);
  std::string calm_hash = result_hash(calm);

  // Launched again (or restarted after the last save but before result.json): the checkpoint
  // is at the last step, nothing is left to train, and the result is written again unchanged.
  fs::remove(calm + "/ddp/result.json");
  auto again = testing::run_process({testing::binary("dtrain"), "launch",
                                     write_job(calm, steps, 0.0), "--run-dir", calm + "/again"},
                                    options);
  INFO(again.out << again.err);
  REQUIRE(again.exit_code == 0);
  CHECK(common::read_file(calm + "/again/logs/worker-0.log")
            .find("rank 0: resumed from step " + std::to_string(steps)) != std::string::npos);
  CHECK(result_hash(calm) == calm_hash);

  std::string chaos = tmp.path() + "/chaos";
  std::string run = chaos + "/run";
  testing::BackgroundProcess launch(
      {testing::binary("dtrain"), "launch", write_job(chaos, steps, 0.05), "--run-dir", run});
  for (int i = 0; i < 1200 && !fs::exists(chaos + "/ddp/checkpoint.pt"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(
      fs::exists(chaos + "/ddp/checkpoint.pt"));  // past step 10 of 120, about 6 s before the end
  REQUIRE_FALSE(fs::exists(chaos + "/ddp/result.json"));
  ::kill(worker_pid(run, 1), SIGKILL);
  auto killed = launch.wait(180);
  INFO(killed.out << killed.err);
  REQUIRE(killed.exit_code == 0);

  std::string log1 = common::read_file(run + "/logs/worker-1.log");
  CHECK(log1.find("==== dtrain: attempt 1") != std::string::npos);
  CHECK(log1.find("RESTART_COUNT=1") != std::string::npos);
  std::smatch resumed;
  REQUIRE(std::regex_search(log1, resumed, std::regex(R"(rank 1: resumed from step (\d+))")));
  CHECK(std::stoi(resumed[1]) > 0);
  CHECK(std::stoi(resumed[1]) < steps);
  CHECK(common::read_file(run + "/events.jsonl").find("\"restart\"") != std::string::npos);
  CHECK(result_hash(chaos) == result_hash(calm));  // the same weights, bit for bit
}
