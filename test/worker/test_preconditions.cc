// The worker's start-up refusals, checked again at planning (docs/design.md#preconditions):
// `dtrain validate` refuses each job dtrain-worker would refuse at start, exit 2, with the
// worker's own words (train/preconditions.h): elastic jobs over shared memory, with synchronized
// batch normalization or on a GPU (and, by the shared rule alone, with file sharding); and, for
// "device": "cuda", each part of a job that has not passed its parity test on a GPU. Where this
// machine lets the worker reach its check (the elastic cases on the CPU), the worker's message is
// compared too.
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/cluster_spec.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/tf_config.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "worker/train/preconditions.h"
#include "worker/train/train_config.h"

using namespace dtrain;

namespace {

// configs/tiny-synthetic.json with each (from, to) replacement made.
std::string job_text(const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string text =
      common::read_file(std::string(DTRAIN_SOURCE_DIR) + "/configs/tiny-synthetic.json");
  for (const auto& [from, to] : edits) {
    size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  return text;
}

// What the shared check says of the job: the message both programs must print.
train::TrainConfig parsed(const std::string& path) {
  common::JsonDocument doc = common::JsonDocument::parse(common::read_file(path), path);
  return train::parse_train_config(doc.root().at("train").dump(), path);
}

std::string expected_message(const std::string& path, bool elastic) {
  const train::TrainConfig config = parsed(path);
  const bool on_gpu = config.device == train::DeviceChoice::kCuda;
  try {
    if (on_gpu) train::check_gpu_rule(config, path);
    if (elastic) train::check_elastic(config, on_gpu, path);
  } catch (const common::ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

struct Case {
  const char* name;
  std::vector<std::pair<std::string, std::string>> edits;
  bool elastic;
  const char* names;  ///< part of the message: the key it names
};

const std::string kElastic = R"("workers": 2, "elastic": {"min_workers": 1},)";
const std::string kCuda = R"("device": "cuda")";

}  // namespace

TEST_CASE("dtrain validate refuses what the worker refuses at start, in its words") {
  const std::vector<Case> cases = {
      {"elastic over shared memory",
       {{"\"workers\": 2,", kElastic}, {R"("communication": "ring")", R"("communication": "shm")"}},
       true,
       "train.communication: \"shm\" cannot hold virtual shards"},
      {"elastic with synchronized batch normalization",
       {{"\"workers\": 2,", kElastic},
        {R"({"type": "flatten"},)",
         R"({"type": "batch_normalization", "synchronized": true}, {"type": "flatten"},)"}},
       true,
       "train.model.layers[1].synchronized: true"},
      {"elastic on a GPU",
       {{"\"workers\": 2,", kElastic}, {R"("device": "cpu")", kCuda}},
       true,
       "an elastic job (\"elastic\" in the job file) trains on CPUs only"},
      {"a layer untested on a GPU",
       {{R"({"type": "flatten"},)", R"({"type": "batch_normalization"}, {"type": "flatten"},)"},
        {R"("device": "cpu")", kCuda}},
       false,
       "train.model.layers[1]: batch_normalization has not passed its parity test on a GPU"},
      {"label smoothing on a GPU",
       {{R"("from_logits": true})", R"("from_logits": true, "label_smoothing": 0.1})"},
        {R"("device": "cpu")", kCuda}},
       false,
       "train.loss.label_smoothing has not passed"},
      {"a loss untested on a GPU",
       {{R"("sparse_categorical_crossentropy", "from_logits": true})",
         R"("categorical_crossentropy", "from_logits": true})"},
        {R"("device": "cpu")", kCuda}},
       false,
       "train.loss.type has not passed"},
      {"weight decay on a GPU",
       {{R"("momentum": 0.9})", R"("momentum": 0.9, "weight_decay": 0.01})"},
        {R"("device": "cpu")", kCuda}},
       false,
       "train.optimizer.weight_decay has not passed"},
      {"clipnorm on a GPU",
       {{R"("momentum": 0.9})", R"("momentum": 0.9, "clipnorm": 1.0})"},
        {R"("device": "cpu")", kCuda}},
       false,
       "train.optimizer.clipnorm has not passed"},
  };
  testing::TempDir dir;
  for (const Case& c : cases) {
    INFO(c.name);
    const std::string job = dir.path() + "/job.json";
    common::write_file_atomically(job, job_text(c.edits));
    const std::string message = expected_message(job, c.elastic);
    CHECK_THAT(message, Catch::Contains(c.names));

    testing::ProcessOptions quiet;
    quiet.timeout_seconds = 60;
    testing::ProcessResult v =
        testing::run_process({testing::binary("dtrain"), "validate", job}, quiet);
    CHECK(v.exit_code == 2);
    CHECK_THAT(v.err, Catch::Contains(message));

    // The worker, as the launcher would start it, where it reaches the check on this machine:
    // the elastic cases on the CPU (a "cuda" job stops earlier here, at its missing GPU).
    if (!c.elastic || message.find("trains on CPUs only") != std::string::npos) continue;
    common::ClusterSpec cluster({{"worker", {"127.0.0.1:1", "127.0.0.1:2"}}});
    testing::ProcessOptions options = quiet;
    options.env["TF_CONFIG"] = common::format_tf_config(cluster, {"worker", 0});
    options.env["DTRAIN_MEMBERS"] = "0";
    options.env["DTRAIN_CONTROL"] = std::nullopt;
    testing::ProcessResult r = testing::run_process(
        {testing::binary("dtrain-worker"), "--config", job, "--run-dir", dir.path() + "/run"},
        options);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(message));
  }
}

// shard_policy "file" needs data in files, which the worker reads before it checks: the rule
// itself, on the parsed job.
TEST_CASE("an elastic job with file sharding is refused by the shared rule") {
  testing::TempDir dir;
  const std::string job = dir.path() + "/job.json";
  common::write_file_atomically(job, job_text({}));
  train::TrainConfig config = parsed(job);
  CHECK_NOTHROW(train::check_elastic(config, false, job));
  config.data.shard_policy = "file";
  CHECK_THROWS_WITH(train::check_elastic(config, false, job),
                    Catch::Contains(job + ": train.data.shard_policy: \"file\" gives each worker "
                                          "only its files"));
}
