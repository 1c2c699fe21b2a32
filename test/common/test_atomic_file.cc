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

TEST_CASE("read_file refuses what is not a regular file, without blocking on it") {
  dtrain::testing::TempDir dir;
  std::string fifo = dir.path() + "/job.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // A FIFO with no writer: opening it for reading would wait for one forever.
  CHECK_THROWS_WITH(read_file(fifo), Catch::Contains(fifo) && Catch::Contains("a FIFO"));
  CHECK_THROWS_WITH(read_file("/dev/zero"),
                    Catch::Contains("/dev/zero") && Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(read_file(dir.path()), Catch::Contains("a folder"));
}

TEST_CASE("read_file stops at its cap; files that do not know their size still read") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/big.json";
  write_file_atomically(path, std::string(1000, ' '));
  CHECK(read_file(path, 1000).size() == 1000);
  CHECK_THROWS_WITH(read_file(path, 999),
                    Catch::Contains(path) && Catch::Contains("longer than 999 bytes"));
  // /proc files say they are empty (size 0) but are not.
  CHECK(read_file("/proc/self/status").find("Pid:") != std::string::npos);
  CHECK_THROWS_WITH(read_file("/proc/self/status", 10), Catch::Contains("longer than 10 bytes"));
}

TEST_CASE("read_exactly reads what was asked or names the shortfall") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/f";
  write_file_atomically(path, "abcdef");
  uint64_t size = 0;
  UniqueFd fd = open_regular_file(path, &size);
  CHECK(size == 6);
  CHECK(read_exactly(fd.get(), 4, path) == "abcd");
  CHECK_THROWS_WITH(read_exactly(fd.get(), 4, path),
                    Catch::Contains(path) && Catch::Contains("ends after 2 of the 4 bytes"));
}
