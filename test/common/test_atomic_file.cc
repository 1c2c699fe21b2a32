// Atomic replacement on a real file system: new content appears whole, failures leave the old
// file and no temporary behind.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "test/support/temp_dir.h"

using namespace dtrain::common;
namespace fs = std::filesystem;

TEST_CASE("write_file_atomically creates and replaces whole files") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/state.json";
  write_file_atomically(path, "first");
  CHECK(read_file(path) == "first");
  std::string big(3 << 20, 'x');
  write_file_atomically(path, big);
  CHECK(read_file(path) == big);
  write_file_atomically(path, "");
  CHECK(read_file(path).empty());
  // Nothing but the target is left in the folder.
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("a failed write leaves the old file and no temporary") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/keep.json";
  write_file_atomically(path, "old");
  // Renaming onto a non-empty folder fails after the temporary was written.
  std::string blocked = dir.path() + "/blocked";
  fs::create_directories(blocked + "/inside");
  CHECK_THROWS_AS(write_file_atomically(blocked, "new"), IoError);
  CHECK(read_file(path) == "old");
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("errors name the path") {
  CHECK_THROWS_WITH(write_file_atomically("/nonexistent-dtrain/x/y.json", "a"),
                    Catch::Contains("/nonexistent-dtrain/x"));
  CHECK_THROWS_WITH(read_file("/nonexistent-dtrain/z"), Catch::Contains("/nonexistent-dtrain/z"));
}
