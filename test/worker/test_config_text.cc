// A worker on another host gets the job's text from the launcher in DTRAIN_CONFIG_TEXT, so its
// --config path need not exist there (no shared file system).
#include <catch2/catch.hpp>
#include <filesystem>

#include "common/atomic_file.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using namespace dtrain;

TEST_CASE("dtrain-worker trains from DTRAIN_CONFIG_TEXT when its --config file is absent") {
  testing::TempDir dir;
  std::string job =
      common::read_file(std::string(DTRAIN_SOURCE_DIR) + "/configs/tiny-synthetic.json");
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  options.env["DTRAIN_CONFIG_TEXT"] = job;
  options.env["TF_CONFIG"] = std::nullopt;
  std::string missing = dir.path() + "/not-here/spec.json";
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", missing, "--run-dir", dir.path() + "/run"},
      options);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(std::filesystem::exists(dir.path() + "/run/model/model.safetensors"));

  options.env["DTRAIN_CONFIG_TEXT"] = std::nullopt;  // without it the path is read, and named
  auto without =
      testing::run_process({testing::binary("dtrain-worker"), "--config", missing}, options);
  CHECK(without.exit_code == 2);
  CHECK(without.err.find(missing) != std::string::npos);
}
