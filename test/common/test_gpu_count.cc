// Counting GPUs from the driver's /proc folder: fake proc roots with 0-3 GPU folders under several
// CUDA_VISIBLE_DEVICES values, and the real /proc of whatever machine runs the test (no CUDA here:
// the oracle is a plain listing of /proc/driver/nvidia/gpus).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/gpu_count.h"
#include "test/support/temp_dir.h"

using namespace dtrain::common;
namespace fs = std::filesystem;
using Names = std::vector<std::string>;

namespace {

// A proc root whose driver/nvidia/gpus holds one folder per bus id (none: no such folder).
std::string fake_proc(const dtrain::testing::TempDir& dir, const std::vector<std::string>& buses) {
  std::string root = dir.path() + "/proc";
  fs::create_directories(root + "/driver");
  if (buses.empty()) return root;
  for (const std::string& bus : buses) {
    fs::create_directories(root + "/driver/nvidia/gpus/" + bus);
    std::ofstream(root + "/driver/nvidia/gpus/" + bus + "/information") << "Model: fake\n";
  }
  return root;
}

}  // namespace

TEST_CASE("count_driver_gpus counts the bus-id folders, and 0 without a driver folder") {
  dtrain::testing::TempDir none, empty, three;
  CHECK(count_driver_gpus(fake_proc(none, {})) == 0);
  CHECK(count_driver_gpus(none.path() + "/no/such/root") == 0);
  std::string empty_root = fake_proc(empty, {});
  fs::create_directories(empty_root + "/driver/nvidia/gpus");
  CHECK(count_driver_gpus(empty_root) == 0);
  std::string root = fake_proc(three, {"0000:01:00.0", "0000:41:00.0", "0000:c1:00.0"});
  std::ofstream(root + "/driver/nvidia/gpus/README") << "a file, not a GPU\n";
  CHECK(count_driver_gpus(root) == 3);
}

TEST_CASE("count_visible_gpus applies CUDA_VISIBLE_DEVICES to the driver's count") {
  dtrain::testing::TempDir two_dir, none_dir;
  std::string two = fake_proc(two_dir, {"0000:01:00.0", "0000:02:00.0"});
  std::string none = fake_proc(none_dir, {});
  CHECK(count_visible_gpus(std::nullopt, two) == 2);  // unset: all of them
  CHECK(count_visible_gpus("0,1", two) == 2);
  CHECK(count_visible_gpus("1", two) == 1);
  CHECK(count_visible_gpus("", two) == 0);  // set but empty: none, as in CUDA
  CHECK(count_visible_gpus("-1", two) == 0);
  CHECK(count_visible_gpus("0,1,2,3", two) == 2);  // 2 is not a device: the list stops there
  CHECK(count_visible_gpus("GPU-8f6c3d2a-1b2c-4d5e-9f00-aabbccddeeff", two) == 1);
  CHECK(count_visible_gpus("GPU-a,GPU-b,GPU-c", two) == 2);  // never more than the driver has
  CHECK(count_visible_gpus(std::nullopt, none) == 0);
  CHECK(count_visible_gpus("0,1", none) == 0);
  CHECK(count_visible_gpus("GPU-8f6c3d2a", none) == 0);
}

TEST_CASE("visible_gpu_names keeps entries up to the first invalid one, as CUDA does") {
  CHECK(visible_gpu_names(std::nullopt, 3) == Names{"0", "1", "2"});
  CHECK(visible_gpu_names(std::nullopt, 0).empty());
  CHECK(visible_gpu_names("2,0", 3) == Names{"2", "0"});
  CHECK(visible_gpu_names(" 1 , 2 ", 3) == Names{"1", "2"});
  CHECK(visible_gpu_names("1,-1,0", 3) == Names{"1"});
  CHECK(visible_gpu_names("0,,1", 3) == Names{"0"});
  CHECK(visible_gpu_names("0,0", 3) == Names{"0"});  // a repeat is invalid
  CHECK(visible_gpu_names("1,01", 3) == Names{"1"});
  CHECK(visible_gpu_names("0,GPU-x,1", 3) == Names{"0", "GPU-x", "1"});
  CHECK(visible_gpu_names("GPU-x,GPU-x", 3) == Names{"GPU-x"});
  CHECK(visible_gpu_names("MIG-x", 1) == Names{"MIG-x"});
  CHECK(visible_gpu_names("gpu0", 3).empty());
  CHECK(visible_gpu_names("GPU-", 3).empty());
  CHECK(visible_gpu_names("3", 3).empty());
  CHECK(visible_gpu_names("", 3).empty());
  CHECK(visible_gpu_names(",0", 3).empty());
}

TEST_CASE("parse_gpu_index takes plain decimal indices only") {
  CHECK(parse_gpu_index("0") == 0);
  CHECK(parse_gpu_index("12") == 12);
  CHECK(parse_gpu_index("-1") == std::nullopt);
  CHECK(parse_gpu_index("") == std::nullopt);
  CHECK(parse_gpu_index("1x") == std::nullopt);
  CHECK(parse_gpu_index("+1") == std::nullopt);
  CHECK(parse_gpu_index("GPU-1") == std::nullopt);
  CHECK(parse_gpu_index("99999999999") == std::nullopt);
}

TEST_CASE("on this machine the count is 0 exactly when /proc/driver/nvidia/gpus is absent") {
  const fs::path gpus = "/proc/driver/nvidia/gpus";
  std::error_code ec;
  int listed = 0;
  for (fs::directory_iterator it(gpus, ec), end; !ec && it != end; it.increment(ec)) ++listed;
  bool has_driver = fs::exists(gpus);
  INFO("/proc/driver/nvidia/gpus " << (has_driver ? "lists " : "is absent, ") << listed);
  CHECK(count_driver_gpus() == listed);
  CHECK(count_visible_gpus(std::nullopt) == listed);
  CHECK((count_visible_gpus(std::nullopt) == 0) == (!has_driver || listed == 0));
  if (!has_driver) CHECK(count_visible_gpus("0") == 0);
}
