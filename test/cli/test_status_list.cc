// `dtrain status` with no run named, through the real binary: one row per folder under ./runs
// (a finished run from its state.json, a running one from its launcher, one never launched, one
// with a broken state.json), --json as an array, and exit 2 where there is no ./runs.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "common/json.h"
#include "launcher/control/run_list.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using dtrain::testing::binary;
using dtrain::testing::ProcessResult;
using dtrain::testing::run_process;
namespace fs = std::filesystem;

namespace {

struct Runs {
  ProcessResult dtrain(std::vector<std::string> args) const {
    args.insert(args.begin(), binary("dtrain"));
    return run_process(args, {{}, "", 60, dir.path()});
  }
  // A one-task command job named name whose program is argv.
  std::string job(const std::string& name, const std::string& argv) const {
    std::string path = dir.path() + "/" + name + ".json";
    std::ofstream(path) << R"({"job": ")" << name << R"(", "workers": 1, "command": )" << argv
                        << "}";
    return path;
  }
  dtrain::testing::TempDir dir;
};

// Stops a detached run when the test ends, however it ends (a failed REQUIRE included).
struct StopOnExit {
  const Runs& runs;
  std::string run;
  ~StopOnExit() {
    try {
      runs.dtrain({"stop", run, "--now"});
    } catch (...) {
    }
  }
};

std::optional<dtrain::common::JsonNode> find_run(const dtrain::common::JsonNode& list,
                                                 const std::string& tail) {
  for (const dtrain::common::JsonNode& run : list.as_array()) {
    std::string dir = run.at("run_dir").as_string();
    if (dir.size() >= tail.size() && dir.compare(dir.size() - tail.size(), tail.size(), tail) == 0)
      return run;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("status with no run named lists every run under ./runs") {
  Runs r;
  REQUIRE(r.dtrain({"launch", r.job("done", R"(["true"])")}).exit_code == 0);
  auto started = r.dtrain({"launch", r.job("live", R"(["sleep", "60"])"), "--detach"});
  REQUIRE(started.exit_code == 0);
  StopOnExit stop_live{r, "runs/live"};
  fs::create_directories(r.dir.path() + "/runs/empty");
  fs::create_directories(r.dir.path() + "/runs/broken");
  std::ofstream(r.dir.path() + "/runs/broken/state.json") << "{\"job\": ";
  std::ofstream(r.dir.path() + "/runs/not-a-run.txt") << "a file, not a run\n";
  // JSON, but not the state's shape: an array is unreadable; odd fields are shown as they are.
  fs::create_directories(r.dir.path() + "/runs/list");
  std::ofstream(r.dir.path() + "/runs/list/state.json") << "[]";
  fs::create_directories(r.dir.path() + "/runs/odd");
  std::ofstream(r.dir.path() + "/runs/odd/state.json")
      << R"({"job": 5, "workers": [7, {"last_progress": 3}, {"last_progress": {"epoch": 2}}]})";
  // The detached launcher answers once its control socket is up.
  for (int i = 0; i < 200 && !fs::exists(r.dir.path() + "/runs/live/state.json"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));

  auto table = r.dtrain({"status"});
  INFO(table.out << table.err);
  REQUIRE(table.exit_code == 0);
  CHECK(table.out.rfind("RUN ", 0) == 0);
  size_t lines = std::count(table.out.begin(), table.out.end(), '\n');
  CHECK(lines == 7);  // the header and six runs, sorted by name
  CHECK(table.out.find("runs/broken") < table.out.find("runs/done"));
  CHECK(table.out.find("runs/done") < table.out.find("runs/empty"));
  CHECK(table.out.find("runs/empty") < table.out.find("runs/list"));
  CHECK(table.out.find("runs/list") < table.out.find("runs/live"));
  CHECK(table.out.find("runs/live") < table.out.find("runs/odd"));
  CHECK(table.out.find("never launched") != std::string::npos);
  CHECK(table.out.find("unreadable state.json") != std::string::npos);
  CHECK(table.out.find("unreadable state.json", table.out.find("runs/list")) <
        table.out.find("runs/live"));
  CHECK(table.out.find("epoch 2/?") != std::string::npos);  // runs/odd's third worker
  CHECK(table.out.find("not-a-run") == std::string::npos);

  auto json = r.dtrain({"status", "--json"});
  REQUIRE(json.exit_code == 0);
  dtrain::common::JsonDocument doc = dtrain::common::JsonDocument::parse(json.out, "status");
  REQUIRE(doc.root().as_array().size() == 6);
  const auto odd = find_run(doc.root(), "/runs/odd");
  REQUIRE(odd);
  CHECK(odd->at("job").dump() == "5");
  const auto done = find_run(doc.root(), "/runs/done");
  REQUIRE(done);
  CHECK(done->at("status").as_string() == "succeeded");
  CHECK(done->at("daemon").as_string() == "gone");
  CHECK(done->at("job").as_string() == "done");
  const auto live = find_run(doc.root(), "/runs/live");
  REQUIRE(live);
  CHECK(live->at("daemon").as_string() == "running");
  std::string live_status = live->at("status").as_string();
  CHECK((live_status == "starting" || live_status == "running"));
  const auto empty = find_run(doc.root(), "/runs/empty");
  REQUIRE(empty);
  CHECK(empty->at("problem").as_string() == "never launched");

  REQUIRE(r.dtrain({"stop", "runs/live", "--now"}).exit_code == 0);
  auto after = r.dtrain({"status", "--json"});
  REQUIRE(after.exit_code == 0);
  dtrain::common::JsonDocument stopped = dtrain::common::JsonDocument::parse(after.out, "status");
  const auto gone = find_run(stopped.root(), "/runs/live");
  REQUIRE(gone);
  CHECK(gone->at("daemon").as_string() == "gone");
}

TEST_CASE("status with no run named and no ./runs is a usage error; an empty ./runs is not") {
  Runs r;
  auto none = r.dtrain({"status"});
  CHECK(none.exit_code == 2);
  CHECK(none.err.find("./runs") != std::string::npos);
  fs::create_directories(r.dir.path() + "/runs");
  auto empty = r.dtrain({"status"});
  CHECK(empty.exit_code == 0);
  CHECK(empty.out == "no runs under ./runs\n");
  auto empty_json = r.dtrain({"status", "--json"});
  CHECK(empty_json.exit_code == 0);
  CHECK(empty_json.out == "[]\n");
}

TEST_CASE("the run list shows preemptions beside restarts") {
  using dtrain::launcher::RunSummary;
  std::vector<RunSummary> runs(2);
  runs[0].dir = "runs/ddp";
  runs[0].state = R"({"job": "ddp", "status": "running", "attempt": 3, "restarts": 1,
                      "preemptions": 2, "updated_at": "t"})";
  runs[1].dir = "runs/scratch";
  runs[1].problem = "never launched";
  std::string table = dtrain::launcher::format_run_table(runs);
  auto words = [](const std::string& line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    for (std::string w; in >> w;) out.push_back(w);
    return out;
  };
  std::istringstream lines(table);
  std::string header, ddp, scratch;
  std::getline(lines, header);
  std::getline(lines, ddp);
  std::getline(lines, scratch);
  std::vector<std::string> expected_header = {"RUN",      "JOB",      "STATUS",
                                              "ATTEMPT",  "RESTARTS", "PREEMPTIONS",
                                              "LAUNCHER", "PROGRESS", "UPDATED"};
  CHECK(words(header) == expected_header);
  std::vector<std::string> expected_ddp = {"runs/ddp", "ddp",  "running", "3", "1",
                                           "2",        "gone", "-",       "t"};
  CHECK(words(ddp) == expected_ddp);
  CHECK(words(scratch).size() == 10);  // "never launched" is two words
  // The counts stand under their headers.
  CHECK(ddp.find(" 2 ") + 1 == header.find("PREEMPTIONS") + std::string("PREEMPTIONS").size() - 1);
}
