// Virtual shards at real dtrain-workers (docs/design.md#elastic-membership): a cluster of four
// training tasks run by all four, by two (members 0 and 3: worker 0 holds shards 0-2) and by one
// (worker 0 holds all four), and without the chief (worker 1 has its duties) ends with the same
// model and the same epoch metrics, bit for bit, and each run's ledger names the same examples for
// every (epoch, step, shard). An elastic worker refuses a transport that cannot hold shards, naming
// the setting.
#include <algorithm>
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
#include "test/support/language_model_job.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "worker/train/safetensors.h"

using namespace dtrain;

namespace {

// A residual network with batch normalization (three of them, one with Keras's momentum 0.9) for
// the tiny job: batch statistics per virtual shard, moving statistics from the shards' mean.
const char* kResidualModel = R"("model": {"input_shape": [8, 8, 1], "layers": [
  {"name": "stem", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
  {"name": "bn0", "type": "batch_normalization"}, {"name": "r0", "type": "relu"},
  {"name": "c1", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
  {"name": "bn1", "type": "batch_normalization"}, {"type": "relu"},
  {"name": "c2", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
  {"name": "bn2", "type": "batch_normalization", "momentum": 0.9},
  {"name": "sum", "type": "add", "inputs": ["r0", "bn2"]}, {"type": "relu"},
  {"type": "flatten"}, {"type": "dense", "units": 4}]},)";

/// The model a run trains: tiny-synthetic's, kResidualModel, or a character GPT on text
/// (test/support/language_model_job.h).
enum class Kind { kPlain, kResidual, kLanguage };

// tiny-synthetic with the ledger, epoch checkpoints only, and communication as asked, with the
// model of kind.
std::string job_file(const testing::TempDir& dir, const std::string& communication,
                     Kind kind = Kind::kPlain) {
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
  if (kind == Kind::kResidual) {
    size_t begin = text.find("\"model\":"), end = text.find("\"loss\":");
    REQUIRE((begin != std::string::npos && end != std::string::npos));
    text.replace(begin, end - begin, kResidualModel);
  }
  if (kind == Kind::kLanguage) text = testing::with_language_model(text);
  const char* suffix[] = {"", "-residual", "-language"};
  std::string path =
      dir.path() + "/job-" + communication + suffix[static_cast<int>(kind)] + ".json";
  common::write_file_atomically(path, text);
  return path;
}

struct Run {
  std::string model, metrics;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> ledger;  ///< ids, as JSON
};

// The four-task cluster run by the given ranks with DTRAIN_MEMBERS = members ("" = unset).
Run run_members(const testing::TempDir& dir, const std::string& name, const std::string& members,
                const std::vector<int>& ranks, Kind kind = Kind::kPlain) {
  std::vector<std::string> addresses;
  for (int port : common::pick_free_ports(4))
    addresses.push_back("127.0.0.1:" + std::to_string(port));
  common::ClusterSpec cluster({{"worker", addresses}});
  std::string job = job_file(dir, "auto", kind), run = dir.path() + "/" + name;
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

// Batch normalization under elastic membership (docs/design.md#batch-normalization): each virtual
// shard normalizes by its own batch, and the moving statistics move by the shards' mean, summed in
// shard order, so the final model (its moving statistics included) is the same bits whoever holds
// the shards.
TEST_CASE("elastic workers: a residual network with batch normalization, any membership") {
  testing::TempDir dir;
  Run full = run_members(dir, "full", "", {0, 1, 2, 3}, Kind::kResidual);
  REQUIRE_FALSE(full.model.empty());
  // The moving statistics moved (from 0 and 1) and travel with the final model.
  train::SafetensorsFile file = train::decode_safetensors(full.model, "model.safetensors");
  for (const char* name : {"bn0.moving_mean", "bn2.moving_variance"}) {
    INFO(name);
    REQUIRE(file.tensors.count(name) == 1);
    const std::vector<float>& v = file.tensors.at(name).data;
    CHECK(v.size() == 4);
    CHECK(std::none_of(v.begin(), v.end(), [](float x) { return x == 0.0f || x == 1.0f; }));
  }
  for (const auto& [name, members, ranks] :
       std::vector<std::tuple<std::string, std::string, std::vector<int>>>{{"two", "0,3", {0, 3}},
                                                                           {"one", "0", {0}}}) {
    INFO(name);
    Run r = run_members(dir, name, members, ranks, Kind::kResidual);
    CHECK(r.model == full.model);
    CHECK(r.metrics == full.metrics);
  }
}

// A language model: its training windows are drawn per (epoch, step, virtual shard, example), so
// whoever holds a shard draws its windows.
TEST_CASE("elastic workers: a character GPT on text, any membership") {
  testing::TempDir dir;
  Run full = run_members(dir, "full", "", {0, 1, 2, 3}, Kind::kLanguage);
  REQUIRE_FALSE(full.model.empty());
  for (const auto& [name, members, ranks] :
       std::vector<std::tuple<std::string, std::string, std::vector<int>>>{{"two", "0,3", {0, 3}},
                                                                           {"one", "0", {0}}}) {
    INFO(name);
    Run r = run_members(dir, name, members, ranks, Kind::kLanguage);
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
