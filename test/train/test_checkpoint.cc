// Checkpoint files: safetensors layout that Python's reader accepts, exact round trips, the
// newest good checkpoint chosen, damaged ones (truncated, flipped byte, half-written) skipped,
// and only `keep` files kept.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "test/support/temp_dir.h"
#include "worker/train/checkpoint.h"

using namespace dtrain;
using namespace dtrain::train;
namespace fs = std::filesystem;

namespace {

std::vector<float> weights(float base) {
  return {base, base + 1.5f, -base, 1e-30f * base, 3.25f};
}

std::string save_one(CheckpointStore& store, int64_t global_step, const std::vector<float>& w) {
  TrainingState s;
  s.epoch = global_step / 10;
  s.step = global_step % 10;
  s.global_step = global_step;
  s.optimizer_iterations = global_step;
  s.epoch_loss_sum = 0.1 * static_cast<double>(global_step);
  return store.save(s, {{"layers.0.dense.kernel", {5}, w.data(), w.size()}}, R"({"arch":1})");
}

}  // namespace

TEST_CASE("safetensors: 8-byte length, JSON header with F32 entries, data; exact round trip") {
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-0.5f};
  std::string bytes = encode_safetensors(
      {{"a", {2, 3}, a.data(), a.size()}, {"b", {1}, b.data(), 1}}, {{"k", "v"}});
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  REQUIRE(8 + length + 7 * sizeof(float) == bytes.size());
  CHECK((8 + length) % 8 == 0);
  auto header = common::JsonDocument::parse(std::string_view(bytes.data() + 8, length), "header");
  CHECK(header.root().at("a").at("dtype").as_string() == "F32");
  CHECK(header.root().at("a").at("data_offsets").dump() == "[0,24]");
  CHECK(header.root().at("b").at("data_offsets").dump() == "[24,28]");
  CHECK(header.root().at("__metadata__").at("k").as_string() == "v");
  SafetensorsFile back = decode_safetensors(bytes, "x");
  CHECK(back.tensors["a"].shape == std::vector<int64_t>{2, 3});
  CHECK(back.tensors["a"].data == a);
  CHECK(back.tensors["b"].data == b);
  CHECK(encode_safetensors({{"a", {2, 3}, a.data(), a.size()}, {"b", {1}, b.data(), 1}},
                           {{"k", "v"}}) == bytes);
}

TEST_CASE("a damaged file fails its checksum or its header, naming the file") {
  std::vector<float> a = weights(2);
  std::string bytes = encode_safetensors({{"a", {5}, a.data(), a.size()}}, {{"epoch", "1"}});
  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  CHECK_THROWS_WITH(decode_safetensors(flipped, "f.safetensors"),
                    Catch::Contains("f.safetensors: checksum mismatch"));
  std::string metadata_changed = bytes;
  metadata_changed.replace(metadata_changed.find("\"epoch\":\"1\""), 11, "\"epoch\":\"2\"");
  CHECK_THROWS_WITH(decode_safetensors(metadata_changed, "m"),
                    Catch::Contains("checksum mismatch"));
  CHECK_THROWS_WITH(decode_safetensors(bytes.substr(0, bytes.size() - 4), "t"),
                    Catch::Contains("t: bad header"));
  CHECK_THROWS_WITH(decode_safetensors(bytes.substr(0, 20), "h"),
                    Catch::Contains("h: truncated header"));
  CHECK_THROWS_WITH(decode_safetensors("abc", "s"), Catch::Contains("s: truncated"));
}

TEST_CASE("the newest checkpoint that verifies is restored; damaged ones are skipped") {
  testing::TempDir dir;
  CheckpointStore store(dir.path() + "/backup", 5);
  save_one(store, 10, weights(1));
  std::string second = save_one(store, 20, weights(2));
  std::string third = save_one(store, 30, weights(3));
  auto latest = store.load_latest(R"({"arch":1})");
  REQUIRE(latest);
  CHECK(latest->state.global_step == 30);
  CHECK(latest->state.epoch_loss_sum == 3.0);
  CHECK(latest->file.tensors["layers.0.dense.kernel"].data == weights(3));

  std::string bytes = common::read_file(third);
  std::ofstream(third, std::ios::binary | std::ios::trunc)
      << bytes.substr(0, bytes.size() / 2);  // truncated
  latest = store.load_latest(R"({"arch":1})");
  REQUIRE(latest);
  CHECK(latest->state.global_step == 20);

  std::string b2 = common::read_file(second);
  b2[b2.size() - 1] ^= 1;  // one flipped bit in the data
  std::ofstream(second, std::ios::binary | std::ios::trunc) << b2;
  latest = store.load_latest(R"({"arch":1})");
  REQUIRE(latest);
  CHECK(latest->state.global_step == 10);
  CHECK(latest->file.tensors["layers.0.dense.kernel"].data == weights(1));

  CHECK_FALSE(store.load_latest(R"({"arch":2})"));  // another model: nothing to resume
}

TEST_CASE(
    "a kill during a write leaves the run resumable: half-written temp files and the index don't "
    "matter") {
  testing::TempDir dir;
  CheckpointStore store(dir.path() + "/backup", 2);
  save_one(store, 7, weights(7));
  std::ofstream(dir.path() + "/backup/.ckpt-0000000008.safetensors.tmp.123") << "half a checkpoi";
  std::ofstream(dir.path() + "/backup/checkpoint.json", std::ios::trunc)
      << "{\"latest\": ";  // torn index
  auto latest = store.load_latest(R"({"arch":1})");
  REQUIRE(latest);
  CHECK(latest->state.global_step == 7);
}

TEST_CASE("only the newest `keep` checkpoints stay, and the index names the newest") {
  testing::TempDir dir;
  CheckpointStore store(dir.path() + "/backup", 2);
  for (int64_t step : {5, 10, 15, 20}) save_one(store, step, weights(static_cast<float>(step)));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path() + "/backup"))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"checkpoint.json", "ckpt-0000000015.safetensors",
                                         "ckpt-0000000020.safetensors"});
  auto index = common::JsonDocument::parse(
      common::read_file(dir.path() + "/backup/checkpoint.json"), "index");
  CHECK(index.root().at("latest").as_string() == "ckpt-0000000020.safetensors");
  store.remove_all();
  CHECK_FALSE(fs::exists(dir.path() + "/backup"));
}
