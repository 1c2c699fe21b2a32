// Checkpoint files: safetensors layout that Python's reader accepts, exact round trips, the
// newest good checkpoint chosen, damaged ones (truncated, flipped byte, half-written) skipped,
// and only `keep` files kept. Files with a good checksum are still checked: other models' files
// are never pruned, out-of-range metadata and folders named like checkpoints are skipped, the
// header is read first and bounds the rest, and tensors must have the model's shapes.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>

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

TEST_CASE("checkpoints record the class names when there are some, as a JSON list") {
  testing::TempDir dir;
  CheckpointStore store(dir.path() + "/backup", 5);
  std::string plain = save_one(store, 10, weights(1));
  CHECK(read_safetensors_metadata(plain).count("class_names") == 0);
  store.set_class_names({"boot", "coat \"long\""});
  std::string named = save_one(store, 20, weights(2));
  CHECK(read_safetensors_metadata(named)["class_names"] == R"(["boot","coat \"long\""])");
  auto latest = store.load_latest(R"({"arch":1})");  // the checksum covers them
  REQUIRE(latest);
  CHECK(latest->path == named);
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

namespace {

// A checkpoint file with a valid checksum whatever it says: the CRC proves integrity, not sense.
std::string forged(const std::string& dir, int64_t global_step, const std::string& architecture,
                   std::map<std::string, std::string> overrides = {},
                   std::vector<float> w = weights(1)) {
  std::map<std::string, std::string> m = {{"format", "dtrain-checkpoint"},
                                          {"format_version", "2"},
                                          {"architecture", architecture},
                                          {"epoch", "1"},
                                          {"step", "0"},
                                          {"global_step", std::to_string(global_step)},
                                          {"optimizer_iterations", "0"},
                                          {"epoch_loss_sum", "0"},
                                          {"epoch_correct", "0"},
                                          {"epoch_seen", "0"}};
  for (const auto& [key, value] : overrides) m[key] = value;
  std::string path = fmt::format("{}/ckpt-{:010}.safetensors", dir, global_step);
  fs::create_directories(dir);
  common::write_file_atomically(
      path, encode_safetensors({{"layers.0.dense.kernel", {5}, w.data(), w.size()}}, m,
                               ChecksumScope::kIndexToo));
  return path;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("a leftover checkpoint of another model, at a later step, does not prune this run's") {
  testing::TempDir dir;
  std::string backup = dir.path() + "/backup";
  std::string foreign = forged(backup, 999999, R"({"arch":"other"})");
  CheckpointStore store(backup, 1);
  save_one(store, 10, weights(10));
  save_one(store, 20, weights(20));
  // keep: 1 keeps this model's newest; the other model's file is not this run's to delete.
  CHECK(files_in(backup) == std::vector<std::string>{"checkpoint.json",
                                                     "ckpt-0000000020.safetensors",
                                                     "ckpt-0000999999.safetensors"});
  auto latest = store.load_latest(R"({"arch":1})");
  REQUIRE(latest);
  CHECK(latest->state.global_step == 20);
  auto index = common::JsonDocument::parse(common::read_file(backup + "/checkpoint.json"), "i");
  CHECK(index.root().at("latest").as_string() == "ckpt-0000000020.safetensors");
  CHECK(index.root().at("all").dump() == R"(["ckpt-0000000020.safetensors"])");
  store.remove_all();  // a successful run: backup/ goes (docs/design.md#run-directory)
  CHECK_FALSE(fs::exists(backup));
}

TEST_CASE("epoch, step and sums of a checkpoint are range-checked although its checksum is good") {
  testing::TempDir dir;
  std::string backup = dir.path() + "/backup";
  forged(backup, 5, R"({"arch":1})");
  const std::map<std::string, std::string> bad[] = {
      {{"epoch", "-1"}},          {{"step", "-3"}},
      {{"global_step", "12abc"}}, {{"step", "9"}},  // past its global step, 6
      {{"epoch", "99999999"}},    {{"epoch_seen", "nan"}},
      {{"epoch_loss_sum", "-2"}}, {{"optimizer_iterations", ""}},
  };
  for (const auto& overrides : bad) {
    INFO(overrides.begin()->first << " = \"" << overrides.begin()->second << "\"");
    forged(backup, 6, R"({"arch":1})", overrides);
    auto latest = CheckpointStore(backup, 5).load_latest(R"({"arch":1})");
    REQUIRE(latest);
    CHECK(latest->state.global_step == 5);  // the forged one is skipped, the one before used
  }
  forged(backup, 6, R"({"arch":1})", {{"epoch", "3"}, {"step", "4"}});
  CHECK(CheckpointStore(backup, 5).load_latest(R"({"arch":1})")->state.global_step == 6);
}

TEST_CASE(
    "a folder named like a checkpoint is passed over, and refused once where it is in the way") {
  testing::TempDir dir;
  std::string backup = dir.path() + "/backup";
  fs::create_directories(backup + "/ckpt-0000000099.safetensors/inside");
  fs::create_directories(backup + "/ckpt-0000000020.safetensors/inside");
  CheckpointStore store(backup, 1);
  CHECK_FALSE(store.load_latest(R"({"arch":1})"));
  save_one(store, 10, weights(10));  // a later-named folder does not push it out
  auto latest = store.load_latest(R"({"arch":1})");
  REQUIRE(latest);
  CHECK(latest->state.global_step == 10);
  CHECK_THROWS_AS(save_one(store, 20, weights(20)), common::ConfigError);
  CHECK_THROWS_WITH(
      save_one(store, 20, weights(20)),
      Catch::Contains(backup + "/ckpt-0000000020.safetensors") && Catch::Contains("in the way"));
  store.remove_all();  // folders are not the store's: they stay
  CHECK(files_in(backup) ==
        std::vector<std::string>{"ckpt-0000000020.safetensors", "ckpt-0000000099.safetensors"});
}

TEST_CASE("remove_all deletes the store's files only, and the folder only when that empties it") {
  testing::TempDir dir;
  std::string backup = dir.path() + "/backup";
  CheckpointStore store(backup, 2);
  save_one(store, 10, weights(10));
  std::ofstream(backup + "/.ckpt-0000000011.safetensors.tmp.77") << "half";
  std::ofstream(backup + "/notes.txt") << "mine";
  store.remove_all();
  CHECK(files_in(backup) == std::vector<std::string>{"notes.txt"});
  fs::remove(backup + "/notes.txt");
  save_one(store, 10, weights(10));
  store.remove_all();
  CHECK_FALSE(fs::exists(backup));
}

TEST_CASE("read_safetensors reads the header first and no more than it describes") {
  testing::TempDir dir;
  std::string path = forged(dir.path(), 3, "a");
  CHECK(read_safetensors(path).tensors.at("layers.0.dense.kernel").data == weights(1));
  std::string bytes = common::read_file(path);
  SECTION("not a regular file") {
    CHECK_THROWS_WITH(read_safetensors("/dev/zero"), Catch::Contains("not a regular file"));
    std::string fifo = dir.path() + "/ckpt-0000000004.safetensors";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK_THROWS_WITH(read_safetensors(fifo), Catch::Contains("a FIFO"));
  }
  SECTION("a header length beyond the file or the limit") {
    std::string huge = bytes;
    for (int i = 0; i < 8; ++i) huge[static_cast<size_t>(i)] = '\x7f';
    common::write_file_atomically(path, huge);
    CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("truncated header"));
  }
  SECTION("data beyond what the header describes") {
    common::write_file_atomically(path, bytes + "more");
    CHECK_THROWS_WITH(read_safetensors(path),
                      Catch::Contains("the header describes 20 bytes of data, the file has 24"));
  }
  SECTION("a header nested thousands deep") {
    std::string header = "{\"x\":" + std::string(5000, '[') + std::string(5000, ']') + "}";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i)
      file[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
    common::write_file_atomically(path, file + header);
    CHECK_THROWS_WITH(read_safetensors(path),
                      Catch::Contains("bad header") && Catch::Contains("levels deep"));
  }
}

TEST_CASE("restore_tensors: a tensor of another shape or a missing weight is an error naming it") {
  testing::TempDir dir;
  std::string path = forged(dir.path() + "/backup", 3, "a");
  LoadedCheckpoint c{path, {}, read_safetensors(path), {}, {}};
  std::vector<float> out(5, -1.0f), slot(5, -1.0f), other(6, -1.0f);
  restore_tensors(c, {{"layers.0.dense.kernel", {5}, out.data(), 5},
                      {"optimizer.sgd.velocity.layers.0.dense.kernel", {5}, slot.data(), 5}});
  CHECK(out == weights(1));
  CHECK(slot == std::vector<float>(5, 0.0f));  // the optimizer changed: a fresh slot
  CHECK_THROWS_WITH(restore_tensors(c, {{"layers.0.dense.kernel", {6}, other.data(), 6}}),
                    Catch::Contains(path) && Catch::Contains("tensor layers.0.dense.kernel has "
                                                             "shape [5] (5 values), the model's "
                                                             "is [6] (6 values)"));
  CHECK_THROWS_AS(restore_tensors(c, {{"layers.0.dense.kernel", {6}, other.data(), 6}}),
                  common::ConfigError);
  CHECK_THROWS_WITH(restore_tensors(c, {{"layers.1.dense.bias", {5}, out.data(), 5}}),
                    Catch::Contains("has no tensor layers.1.dense.bias"));
}

TEST_CASE("a backup folder reached through a symlink loses only the store's files") {
  testing::TempDir dir;
  fs::create_directories(dir.path() + "/victim/backup");
  std::ofstream(dir.path() + "/victim/backup/precious.txt") << "keep me";
  fs::create_directories(dir.path() + "/run");
  fs::create_directory_symlink(dir.path() + "/victim", dir.path() + "/run/link");
  CheckpointStore store(dir.path() + "/run/link/backup", 2);
  save_one(store, 10, weights(10));
  store.remove_all();
  CHECK(files_in(dir.path() + "/victim/backup") == std::vector<std::string>{"precious.txt"});
}

namespace {

// Replaces the header of the safetensors file at path by edit(header), padded again to 8 bytes
// and with its length prefix rewritten, so only what edit changed differs.
void edit_header(const std::string& path, const std::function<void(std::string&)>& edit) {
  std::string bytes = common::read_file(path);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  std::string header = bytes.substr(8, length), data = bytes.substr(8 + length);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  edit(header);
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  common::write_file_atomically(path, out + header + data);
}

// Where the "[begin,end]" of tensor name's data_offsets sits in header.
std::pair<size_t, size_t> offsets_of(const std::string& header, const std::string& name) {
  size_t at = header.find("\"data_offsets\":", header.find("\"" + name + "\":"));
  REQUIRE(at != std::string::npos);
  size_t begin = header.find('[', at), end = header.find(']', begin) + 1;
  return {begin, end - begin};
}

void set_offsets(std::string& header, const std::string& name, const std::string& offsets) {
  auto [at, size] = offsets_of(header, name);
  header.replace(at, size, offsets);
}

void swap_offsets(std::string& header, const std::string& a, const std::string& b) {
  auto [at_a, size_a] = offsets_of(header, a);
  auto [at_b, size_b] = offsets_of(header, b);
  std::string offsets_a = header.substr(at_a, size_a), offsets_b = header.substr(at_b, size_b);
  set_offsets(header, a, offsets_b);
  set_offsets(header, b, offsets_a);
}

// Two layers' kernels of the same shape and their momentum slots, as the trainer saves them.
std::string save_two_layers(CheckpointStore& store, int64_t global_step,
                            const std::vector<std::vector<float>>& v) {
  TrainingState s;
  s.epoch = 1;
  s.global_step = global_step;
  return store.save(s,
                    {{"layers.0.dense.kernel", {5}, v[0].data(), 5},
                     {"layers.1.dense.kernel", {5}, v[1].data(), 5},
                     {"optimizer.momentum.layers.0.dense.kernel", {5}, v[2].data(), 5},
                     {"optimizer.momentum.layers.1.dense.kernel", {5}, v[3].data(), 5}},
                    R"({"arch":1})");
}

}  // namespace

// Issue 25 (6): the checksum covered metadata and data but not the tensor index, so swapping two
// same-shape tensors' data_offsets restored the model scrambled, silently.
TEST_CASE("a checkpoint whose header points tensors at other bytes is refused, not restored") {
  testing::TempDir dir;
  CheckpointStore store(dir.path() + "/backup", 5);
  const std::vector<std::vector<float>> v = {weights(1), weights(2), weights(3), weights(4)};
  save_two_layers(store, 10, v);
  std::string path = save_two_layers(store, 20, v);
  REQUIRE(store.load_latest(R"({"arch":1})")->state.global_step == 20);

  SECTION("two weights and their momentum buffers swapped: the previous checkpoint is used") {
    edit_header(path, [](std::string& h) {
      swap_offsets(h, "layers.0.dense.kernel", "layers.1.dense.kernel");
      swap_offsets(h, "optimizer.momentum.layers.0.dense.kernel",
                   "optimizer.momentum.layers.1.dense.kernel");
    });
    CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("checksum mismatch"));
    auto latest = store.load_latest(R"({"arch":1})");
    REQUIRE(latest);
    CHECK(latest->state.global_step == 10);
    CHECK(latest->file.tensors["layers.0.dense.kernel"].data == weights(1));
  }
  SECTION("two tensors sharing bytes") {
    edit_header(path, [](std::string& h) { set_offsets(h, "layers.1.dense.kernel", "[0,20]"); });
    CHECK_THROWS_WITH(read_safetensors(path),
                      Catch::Contains("layers.1.dense.kernel's data_offsets [0, 20] overlap "
                                      "tensor layers.0.dense.kernel's [0, 20]"));
    CHECK(store.load_latest(R"({"arch":1})")->state.global_step == 10);
  }
  SECTION("a tensor past the end of the data") {
    std::string bytes;
    edit_header(path, [](std::string& h) {
      set_offsets(h, "optimizer.momentum.layers.1.dense.kernel", "[80,100]");
    });
    bytes = common::read_file(path);
    CHECK_THROWS_WITH(decode_safetensors(bytes, "x"),
                      Catch::Contains("x: bad header: tensor "
                                      "optimizer.momentum.layers.1.dense.kernel's data_offsets go "
                                      "to byte 100, the data has 80"));
    CHECK_THROWS_WITH(decode_safetensors(bytes + std::string(20, '\0'), "x"),
                      Catch::Contains("bytes 60 to 80 of the data belong to no tensor"));
    CHECK(store.load_latest(R"({"arch":1})")->state.global_step == 10);
  }
  SECTION("a checkpoint of format version 1 (checksum without the index) is refused") {
    forged(dir.path() + "/backup", 30, R"({"arch":1})", {{"format_version", "1"}});
    CHECK(store.load_latest(R"({"arch":1})")->state.global_step == 20);
  }
}

TEST_CASE("model files keep the checksum Python tools check; checkpoints cover the index") {
  std::vector<float> a = weights(1);
  std::string plain = encode_safetensors({{"a", {5}, a.data(), 5}}, {});
  std::string indexed = encode_safetensors({{"a", {5}, a.data(), 5}}, {}, ChecksumScope::kIndexToo);
  CHECK(decode_safetensors(plain, "p").metadata["checksum"].rfind("crc32:", 0) == 0);
  CHECK(decode_safetensors(plain, "p").checksum_scope == ChecksumScope::kMetadataAndData);
  CHECK(decode_safetensors(indexed, "i").metadata["checksum"].rfind("crc32-index:", 0) == 0);
  CHECK(decode_safetensors(indexed, "i").checksum_scope == ChecksumScope::kIndexToo);
}
