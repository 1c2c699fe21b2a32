// Virtual shards at real dtrain-workers (docs/design.md#elastic-membership): a cluster of four
// training tasks run by all four, by two (members 0 and 3: worker 0 holds shards 0-2) and by one
// (worker 0 holds all four), and without the chief (worker 1 has its duties) ends with the same
// model and the same epoch metrics, bit for bit, and each run's ledger names the same examples for
// every (epoch, step, shard). An elastic worker refuses a transport that cannot hold shards, naming
// the setting.
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/atomic_file.h"
#include "common/cluster_spec.h"
#include "common/json.h"
#include "common/ports.h"
#include "common/tf_config.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;

namespace {

// tiny-synthetic with the ledger, epoch checkpoints only, and communication as asked.
std::string job_file(const testing::TempDir& dir, const std::string& communication) {
  std::string text =
      common::read_file(std::string(DTRAIN_SOURCE_DIR) + "/configs/tiny-synthetic.json");
  auto replace = [&](const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  };
  replace("\"save_freq\": 4", "\"save_freq\": \"epoch\"");
  replace("\"seed\": 7,", "\"seed\": 7, \"ledger\": true,");
  replace("\"communication\": \"ring\"", "\"communication\": \"" + communication + "\"");
  std::string path = dir.path() + "/job-" + communication + ".json";
  common::write_file_atomically(path, text);
  return path;
}

struct Run {
  std::string model, metrics;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> ledger;  ///< ids, as JSON
};

// The four-task cluster run by the given ranks with DTRAIN_MEMBERS = members ("" = unset).
Run run_members(const testing::TempDir& dir, const std::string& name, const std::string& members,
                const std::vector<int>& ranks) {
  std::vector<std::string> addresses;
  for (int port : common::pick_free_ports(4))
    addresses.push_back("127.0.0.1:" + std::to_string(port));
  common::ClusterSpec cluster({{"worker", addresses}});
  std::string job = job_file(dir, "auto"), run = dir.path() + "/" + name;
  std::vector<std::unique_ptr<testing::BackgroundProcess>> workers;
  for (int rank : ranks) {
    testing::ProcessOptions options;
    options.timeout_seconds = 120;
    options.env["TF_CONFIG"] = common::format_tf_config(cluster, {"worker", rank});
    options.env["DTRAIN_MEMBERS"] = members;
    options.env["DTRAIN_TOKEN"] = "0123abcd";
    options.env["DTRAIN_JOB"] = "elastic-" + name;
    options.env["DTRAIN_CONTROL"] = std::nullopt;
    options.env["DTRAIN_RECOVERY"] = std::nullopt;
    options.env["OMP_NUM_THREADS"] = "1";
    workers.push_back(std::make_unique<testing::BackgroundProcess>(
        std::vector<std::string>{testing::binary("dtrain-worker"), "--config", job, "--run-dir",
                                 run},
        options));
  }
  for (auto& worker : workers) {
    testing::ProcessResult r = worker->wait(120);
    INFO(name << ": " << r.err);
    REQUIRE(r.exit_code == 0);
  }
  std::ifstream model(run + "/model/model.safetensors", std::ios::binary);
  Run out{std::string(std::istreambuf_iterator<char>(model), {}), "", {}};
  std::ifstream metrics(run + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {  // loss and accuracy, not the timings
    common::JsonDocument d = common::JsonDocument::parse(line, "metrics.jsonl");
    out.metrics += d.root().at("loss").dump() + " " + d.root().at("accuracy").dump() + "\n";
  }
  for (int rank : ranks) {
    std::ifstream in(run + "/ledger/worker-" + std::to_string(rank) + ".jsonl");
    for (std::string line; std::getline(in, line);) {
      common::JsonDocument d = common::JsonDocument::parse(line, "ledger");
      auto key = std::make_tuple(d.root().at("epoch").as_int(0, 99),
                                 d.root().at("step").as_int(0, 1 << 20),
                                 d.root().at("shard").as_int(0, 3));
      CHECK(d.root().at("task").as_string() == "worker:" + std::to_string(rank));
      out.ledger[key] = d.root().at("ids").dump();
    }
  }
  return out;
}

}  // namespace

TEST_CASE("elastic workers: any membership trains the full group's model, bit for bit") {
  testing::TempDir dir;
  Run full = run_members(dir, "full", "", {0, 1, 2, 3});
  REQUIRE_FALSE(full.model.empty());
  CHECK(full.ledger.size() == 2 * 8 * 4);  // epochs x steps x shards
  for (const auto& [name, members, ranks] :
       std::vector<std::tuple<std::string, std::string, std::vector<int>>>{
           {"two", "0,3", {0, 3}}, {"one", "0", {0}}, {"no-chief", "1,3", {1, 3}}}) {
    INFO(name);
    Run r = run_members(dir, name, members, ranks);
    CHECK(r.model == full.model);
    CHECK(r.metrics == full.metrics);
    CHECK(r.ledger == full.ledger);
  }
}

TEST_CASE("elastic workers: shared memory cannot hold virtual shards (exit 2, the key named)") {
  testing::TempDir dir;
  common::ClusterSpec cluster({{"worker", {"127.0.0.1:1", "127.0.0.1:2"}}});
  testing::ProcessOptions options;
  options.timeout_seconds = 60;
  options.env["TF_CONFIG"] = common::format_tf_config(cluster, {"worker", 0});
  options.env["DTRAIN_MEMBERS"] = "0";
  options.env["DTRAIN_CONTROL"] = std::nullopt;
  std::string job = job_file(dir, "shm");
  testing::ProcessResult r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", job, "--run-dir", dir.path() + "/run"},
      options);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains(job + ": train.communication: \"shm\" cannot hold virtual "
                                          "shards"));
}
