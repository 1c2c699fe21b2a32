// `dtrain generate` (worker/train/generate.h) on a language model one dtrain-worker trained for a
// few steps: the prompt, then the asked number of characters of the model's vocabulary; the same
// seed the same text, another seed another; --top-k 1 the same text at any seed (the likeliest
// character each time); a character the vocabulary lacks, bad options and a run without a
// language model are exit 2 naming what is wrong.
#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <string>

#include "common/atomic_file.h"
#include "common/json.h"
#include "test/support/language_model_job.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;
using Catch::Matchers::Contains;

namespace {

const char* kJob = R"({"train": {
  "model": {},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "adam", "learning_rate": 0.01},
  "data": {"source": "synthetic", "classes": 4},
  "per_worker_batch_size": 8, "epochs": 1, "steps_per_epoch": 30, "seed": 3,
  "tensorboard": false}})";

testing::ProcessResult generate(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::binary("dtrain"), "generate"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_process(argv);
}

}  // namespace

TEST_CASE("dtrain generate samples a trained language model, the same text for a seed") {
  testing::TempDir dir;
  const std::string job = dir.path() + "/job.json", run = dir.path() + "/run";
  std::ofstream(job) << testing::with_language_model(kJob);
  testing::ProcessOptions options;
  options.timeout_seconds = 300;
  options.env["TF_CONFIG"] = std::nullopt;
  auto trained = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", job, "--run-dir", run}, options);
  INFO(trained.err);
  REQUIRE(trained.exit_code == 0);
  const std::string model_json = common::read_file(run + "/model/model.json");
  CHECK_THAT(model_json, Contains(R"("vocabulary":{"kind":"characters","symbols":["\n"," ","!")"));

  auto first = generate({run, "--prompt", "ROMEO:", "--tokens", "40", "--seed", "5"});
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  REQUIRE(first.out.rfind("ROMEO:", 0) == 0);
  // The prompt, 40 characters (every one of tiny-shakespeare's, all ASCII) and a newline.
  CHECK(first.out.size() == 6 + 40 + 1);
  CHECK(generate({run, "--prompt", "ROMEO:", "--tokens", "40", "--seed", "5"}).out == first.out);
  CHECK(generate({run, "--prompt", "ROMEO:", "--tokens", "40", "--seed", "6"}).out != first.out);
  std::set<std::string> greedy;
  for (const char* seed : {"1", "2", "3"})
    greedy.insert(
        generate({run, "--prompt", "ROMEO:", "--tokens", "40", "--top-k", "1", "--seed", seed})
            .out);
  CHECK(greedy.size() == 1);

  auto bad = generate({run, "--prompt", "caf\xc3\xa9"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("the character \"\xc3\xa9\" is not in the model's vocabulary"));
  bad = generate({run, "--temperature", "0"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("--temperature"));
  bad = generate({dir.path() + "/nothing"});
  CHECK(bad.exit_code == 2);
}

TEST_CASE("dtrain generate refuses a run that is not a language model") {
  testing::TempDir dir;
  const std::string job = dir.path() + "/job.json", run = dir.path() + "/run";
  std::string text = kJob;
  text.replace(text.find("\"model\": {}"), 11,
               R"("model": {"input_shape": [4, 4, 1], "layers": [{"type": "flatten"},
                  {"type": "dense", "units": 4}]})");
  common::write_file_atomically(job, text);
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  options.env["TF_CONFIG"] = std::nullopt;
  auto trained = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", job, "--run-dir", run}, options);
  INFO(trained.err);
  REQUIRE(trained.exit_code == 0);
  auto r = generate({run});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("not a language model"));
}
