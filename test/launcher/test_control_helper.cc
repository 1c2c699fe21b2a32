// examples/control/dtrain_progress.py, the stdlib helper a command job imports to report to the
// launcher over DTRAIN_CONTROL (docs/control.md): a 2-worker Python job reports progress, and
// state.json shows it per worker while the job runs and after it ends; with DTRAIN_CONTROL unset
// the helper does nothing. Needs /usr/bin/python3; without it the cases say so and pass.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/json.h"
#include "test/support/processes.h"
#include "test/support/python.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

constexpr const char* kPython = testing::kSystemPython;
const std::string kHelperDir = std::string(DTRAIN_SOURCE_DIR) + "/examples/control";

// Reports epoch 2/3, step 7/10 and a loss that names the worker's index, then sends heartbeats
// until dir/release exists (so the test sees the progress of a running job), then exits 0.
std::string write_script(const std::string& dir) {
  std::string path = dir + "/report.py";
  std::ofstream(path) << "import json, os, sys, time\n"
                      << "sys.path.insert(0, '" << kHelperDir << "')\n"
                      << "import dtrain_progress\n"
                      << "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
                      << "assert dtrain_progress.progress(epoch=2, epochs=3, step=7, steps=10,\n"
                      << "    loss=0.5 + index, accuracy=0.75, samples_per_second=123.5)\n"
                      << "deadline = time.time() + 60\n"
                      << "while not os.path.exists('" << dir << "/release') and "
                      << "time.time() < deadline:\n"
                      << "    dtrain_progress.heartbeat()\n"
                      << "    time.sleep(0.2)\n"
                      << "print('worker', index, 'done')\n";
  return path;
}

std::string write_job(const std::string& dir) {
  std::string job = dir + "/job.json";
  std::ofstream(job) << R"({"job": "progress", "workers": 2, "hang_timeout_seconds": 30,
    "restart": {"max_restarts": 0},
    "command": [")" << kPython
                     << R"(", ")" << write_script(dir) << R"("]})";
  return job;
}

// The last_progress of each worker in run/state.json (fewer when some have none yet).
std::vector<common::JsonDocument> progress_in_state(const std::string& run) {
  std::vector<common::JsonDocument> found;
  std::string text = testing::read_all(run + "/state.json");
  if (text.empty()) return found;
  auto state = common::JsonDocument::parse(text, "state.json");
  for (const common::JsonNode& worker : state.root().at("workers").as_array())
    if (auto p = worker.find("last_progress"))
      found.push_back(common::JsonDocument::parse(p->dump(), "last_progress"));
  return found;
}

void check_progress(const std::vector<common::JsonDocument>& progress) {
  REQUIRE(progress.size() == 2);
  for (size_t i = 0; i < progress.size(); ++i) {
    common::JsonNode p = progress[i].root();
    CHECK(p.at("epoch").as_int(0, 100) == 2);
    CHECK(p.at("epochs").as_int(0, 100) == 3);
    CHECK(p.at("step").as_int(0, 100) == 7);
    CHECK(p.at("steps").as_int(0, 100) == 10);
    CHECK(p.at("loss").as_number(-1e9, 1e9) == Approx(0.5 + static_cast<double>(i)));
    CHECK(p.at("accuracy").as_number(-1e9, 1e9) == Approx(0.75));
    CHECK(p.at("samples_per_second").as_number(-1e9, 1e9) == Approx(123.5));
  }
}

}  // namespace

TEST_CASE("progress a Python command job sends with the helper shows in state.json") {
  if (!fs::exists(kPython)) {
    WARN("skipped: " << kPython << " does not exist");
    return;
  }
  testing::TempDir tmp;
  std::string run = tmp.path() + "/run";
  testing::BackgroundProcess launch(
      {testing::binary("dtrain"), "launch", write_job(tmp.path()), "--run-dir", run});
  // While the job runs: the heartbeats keep state.json fresh, and it carries the progress.
  bool seen = testing::wait_for([&] { return progress_in_state(run).size() == 2; }, 60);
  std::ofstream(tmp.path() + "/release") << "go\n";
  auto result = launch.wait(60);
  INFO(result.out << result.err);
  REQUIRE(seen);
  REQUIRE(result.exit_code == 0);
  // After the end: the last progress each worker reported stays in the final state.json.
  auto state = common::JsonDocument::parse(testing::read_all(run + "/state.json"), "state.json");
  CHECK(state.root().at("status").as_string() == "succeeded");
  check_progress(progress_in_state(run));
}

TEST_CASE("the progress helper does nothing when DTRAIN_CONTROL is unset") {
  if (!fs::exists(kPython)) {
    WARN("skipped: " << kPython << " does not exist");
    return;
  }
  testing::ProcessOptions options;
  options.env["DTRAIN_CONTROL"] = std::nullopt;
  auto r = testing::run_process(
      {kPython, "-c",
       "import sys; sys.path.insert(0, '" + kHelperDir +
           "'); import dtrain_progress as d; "
           "sys.exit(0 if (d.heartbeat(), d.progress(step=1, loss=0.1)) == (False, False) else 1)"},
      options);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
}
