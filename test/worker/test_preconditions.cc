// The worker's start-up refusals, checked again at planning (docs/design.md#preconditions):
// `dtrain validate` refuses each job dtrain-worker would refuse at start, exit 2, with the
// worker's own words (worker/spec/preconditions.h): elastic jobs over shared memory, with
// synchronized batch normalization or on a GPU (and, by the shared rule alone, with file
// sharding); for "device": "cuda", each part of a job that has not passed its parity test on a
// GPU; "nccl" on the CPU; and a mixed policy the CPU cannot compute (mixed_float16 on any CPU,
// mixed_bfloat16 under ONEDNN_MAX_CPU_ISA=AVX2). Where this machine lets the worker reach its check
// (the cases on the CPU), the worker's message is compared too.
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
#include "worker/spec/preconditions.h"
#include "worker/spec/train_config.h"

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

// cap: the ONEDNN_MAX_CPU_ISA both programs run under ("" none): the CPU policy's words name
// the instruction set oneDNN dispatches to, which this process reads once, uncapped.
std::string expected_message(const std::string& path, bool elastic, const std::string& cap) {
  const train::TrainConfig config = parsed(path);
  const bool on_gpu = config.device == train::DeviceChoice::kCuda;
  const bool mixed =
      config.math == nn::MathMode::kBfloat16 || config.math == nn::MathMode::kFloat16;
  if (mixed && !on_gpu && !config.dtype_policy_fallback) {
    if (config.math == nn::MathMode::kFloat16)
      return train::cpu_policy_error(config.math, path).what();
    if (cap == "AVX2") {  // oneDNN then dispatches to avx2, which has no bf16 products
      return path +
             ": train.dtype_policy: \"mixed_bfloat16\": this CPU has no bf16 products (oneDNN "
             "dispatches to avx2; bf16 needs AVX512_BF16 or AMX)";
    }
  }
  try {
    if (on_gpu) train::check_gpu_rule(config, path);
    train::check_transport(config, on_gpu, path);
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
  const char* names;     ///< part of the message: the key it names
  std::string cap = "";  ///< ONEDNN_MAX_CPU_ISA for both programs ("": none)
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
      {"nccl on the CPU",
       {{R"("communication": "ring")", R"("communication": "nccl")"}},
       false,
       "train.communication: \"nccl\": NCCL sums GPU memory only, and this job trains on the CPU"},
      {"mixed_float16 on the CPU",
       {{R"("device": "cpu")", R"("device": "cpu", "dtype_policy": "mixed_float16")"}},
       false,
       "train.dtype_policy: \"mixed_float16\": oneDNN has no float16 products on the CPU"},
      {"mixed_bfloat16 on a CPU without bf16 products",
       {{R"("device": "cpu")", R"("device": "cpu", "dtype_policy": "mixed_bfloat16")"}},
       false,
       "train.dtype_policy: \"mixed_bfloat16\": this CPU has no bf16 products",
       "AVX2"},
  };
  testing::TempDir dir;
  for (const Case& c : cases) {
    INFO(c.name);
    const std::string job = dir.path() + "/job.json";
    common::write_file_atomically(job, job_text(c.edits));
    const std::string message = expected_message(job, c.elastic, c.cap);
    CHECK_THAT(message, Catch::Contains(c.names));

    testing::ProcessOptions quiet;
    quiet.timeout_seconds = 60;
    if (!c.cap.empty()) quiet.env["ONEDNN_MAX_CPU_ISA"] = c.cap;
    testing::ProcessResult v =
        testing::run_process({testing::binary("dtrain"), "validate", job}, quiet);
    CHECK(v.exit_code == 2);
    CHECK_THAT(v.err, Catch::Contains(message));

    // The worker, as the launcher would start it, where it reaches the check on this machine:
    // the CPU cases (a "cuda" job stops earlier here, at its missing GPU).
    if (c.edits.back().second == kCuda) continue;
    common::ClusterSpec cluster({{"worker", {"127.0.0.1:1", "127.0.0.1:2"}}});
    testing::ProcessOptions options = quiet;
    options.env["TF_CONFIG"] = common::format_tf_config(cluster, {"worker", 0});
    if (c.elastic) options.env["DTRAIN_MEMBERS"] = "0";
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
