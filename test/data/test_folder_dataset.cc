// The "directory" source and what train.data adds to every file source (folder_dataset.h):
// folders of PNG and JPEG files written by Debian's PIL, loaded through load_data as the worker
// loads them; validation_split on folders and arrays; FILE sharding; the config's errors.
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/errors.h"
#include "common/json.h"
#include "test/data/image_fixtures.h"
#include "test/support/temp_dir.h"
#include "worker/data/dataset.h"
#include "worker/data/folder_dataset.h"

using namespace dtrain;
using namespace dtrain::data;
using Catch::Matchers::Contains;

namespace {

// Three classes of five 6x6 gray PNGs (class c, image i: every pixel 40 c + i), a class of RGB
// JPEGs of 8x10 in rgb/, and a folder whose images differ in size in mixed/.
constexpr const char* kFolders = R"PY(
import os, sys
from PIL import Image
out = sys.argv[1]
for c, name in enumerate(['cat', 'dog', 'emu']):
    os.makedirs(f'{out}/gray/{name}', exist_ok=True)
    for i in range(5):
        Image.new('L', (6, 6), 40 * c + i).save(f'{out}/gray/{name}/{i}.png')
for c, name in enumerate(['red', 'blue']):
    os.makedirs(f'{out}/rgb/{name}', exist_ok=True)
    for i in range(3):
        Image.new('RGB', (10, 8), (200 - 150 * c, 30 + i, 50 + 150 * c)).save(
            f'{out}/rgb/{name}/{i}.jpg', quality=95)
for name, size in (('a', (6, 6)), ('b', (7, 6))):
    os.makedirs(f'{out}/mixed/{name}', exist_ok=True)
    Image.new('L', size, 9).save(f'{out}/mixed/{name}/x.png')
)PY";

struct Folders {
  testing::TempDir dir;
  bool ok = testing::have_pil();
  Folders() {
    if (ok) testing::run_python(kFolders, {dir.path()});
  }
};

DataConfig parse(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "data");
  return parse_data_config(doc.root());
}

DataConfig folder_config(const std::string& dir, const std::string& extra = "") {
  return parse(R"({"source": "directory", "train_dir": ")" + dir +
               R"(", "color_mode": "grayscale")" + extra + "}");
}

// A PNG whose header says width x height, 8-bit gray, and whose pixel data is cut short: its
// size can be read, and decoding it fails ("truncated").
std::string png_header_only(uint32_t width, uint32_t height) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  const std::string ihdr = "IHDR" + be32(width) + be32(height) + std::string("\x08\0\0\0\0", 5);
  const auto crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(ihdr.data()), static_cast<uInt>(ihdr.size())));
  return std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + ihdr + be32(crc) + be32(1000) + "IDATxx";
}

void write_file(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("a folder per class loads as image_dataset_from_directory labels it", "[folder]") {
  Folders f;
  if (!f.ok) return;
  const std::string gray = f.dir.path() + "/gray";
  auto [train, test] = load_data(folder_config(gray), {6, 6, 1}, false);
  CHECK(train.count == 15);
  CHECK(train.classes == 3);
  CHECK(train.class_names == std::vector<std::string>{"cat", "dog", "emu"});
  CHECK(test.count == 0);
  for (int64_t e = 0; e < 15; ++e) {
    CHECK(train.labels[static_cast<size_t>(e)] == e / 5);
    CHECK(train.bytes[static_cast<size_t>(e) * 36] == 40 * (e / 5) + e % 5);
  }
  // class_names given: that order, those labels.
  auto [named, unused] =
      load_data(folder_config(gray, R"(, "class_names": ["emu", "cat"])"), {6, 6, 1}, false);
  CHECK(named.count == 10);
  CHECK(named.labels.front() == 0);
  CHECK(named.bytes.front() == 80);  // emu's first image

  // RGB JPEGs resized to 4x5 train a 3-channel model's input.
  DataConfig rgb = parse(R"({"source": "directory", "train_dir": ")" + f.dir.path() +
                         R"(/rgb", "image_size": [4, 5]})");
  auto [colour, none] = load_data(rgb, {4, 5, 3}, false);
  CHECK(colour.count == 6);
  CHECK(colour.channels == 3);
  CHECK(colour.bytes.size() == 6u * 4 * 5 * 3);
  CHECK(colour.class_names.front() == "blue");       // sorted: blue before red
  CHECK(std::abs(int{colour.bytes[0]} - 50) <= 3);   // blue's R, through JPEG and the resize
  CHECK(std::abs(int{colour.bytes[2]} - 200) <= 3);  // and its B
  CHECK_THROWS_WITH(load_data(rgb, {4, 5, 1}, false), Contains("model.input_shape"));
}

TEST_CASE("validation_split holds out the same files every time, apart from training", "[folder]") {
  Folders f;
  if (!f.ok) return;
  const std::string gray = f.dir.path() + "/gray";
  DataConfig config = folder_config(gray, R"(, "validation_split": 0.2, "seed": 7)");
  auto [train, validation] = load_data(config, {6, 6, 1}, true);
  CHECK(train.count == 12);
  CHECK(validation.count == 3);  // floor(0.2 x 15), as Keras
  std::multiset<int> pixels;
  for (const Dataset* d : {&train, &validation})
    for (int64_t e = 0; e < d->count; ++e) pixels.insert(d->bytes[static_cast<size_t>(e) * 36]);
  CHECK(pixels.size() == 15);
  CHECK(std::set<int>(pixels.begin(), pixels.end()).size() == 15);  // disjoint, all present
  auto [again_train, again] = load_data(config, {6, 6, 1}, true);
  CHECK(again.bytes == validation.bytes);
  auto [other_train, other] =
      load_data(folder_config(gray, R"(, "validation_split": 0.2, "seed": 8)"), {6, 6, 1}, true);
  CHECK(other.bytes != validation.bytes);
  // Without a test folder or a split, validating is refused; with both, the config is.
  CHECK_THROWS_WITH(load_data(folder_config(gray), {6, 6, 1}, true),
                    Contains("needs \"test_dir\" or \"validation_split\""));
  CHECK_THROWS_WITH(folder_config(gray, R"(, "validation_split": 0.2, "test_dir": "t")"),
                    Contains("not both"));
  CHECK_THROWS_WITH(load_data(folder_config(gray, R"(, "validation_split": 0.01)"), {6, 6, 1}),
                    Contains("leaves 0 for validation"));
}

TEST_CASE("validation_split on arrays takes their last examples, as Keras's fit", "[folder]") {
  Dataset data;
  data.count = 10, data.height = 1, data.width = 1, data.channels = 1, data.classes = 10;
  for (int i = 0; i < 10; ++i) {
    data.bytes.push_back(static_cast<uint8_t>(i));
    data.labels.push_back(i);
  }
  auto [train, validation] = split_last(data, 0.25);
  CHECK(train.count == 8);
  CHECK(validation.count == 2);
  CHECK(validation.labels == std::vector<int32_t>{8, 9});
  CHECK(validation.bytes == std::vector<uint8_t>{8, 9});
  CHECK(train.labels.back() == 7);
  Dataset shard = keep_shard(data, {1, 3});
  CHECK(shard.labels == std::vector<int32_t>{1, 4, 7});
  CHECK(shard.bytes == std::vector<uint8_t>{1, 4, 7});
  CHECK(shard.global_count == 10);
  CHECK_THROWS_WITH(keep_shard(data, {0, 11}), Contains("10 training examples for 11 workers"));
}

TEST_CASE("sharded by file, each worker decodes only its files; together they are all",
          "[folder]") {
  Folders f;
  if (!f.ok) return;
  DataConfig config = folder_config(f.dir.path() + "/gray", R"(, "shard_policy": "file")");
  std::multiset<int> pixels;
  for (int index = 0; index < 2; ++index) {
    auto [train, test] = load_data(config, {6, 6, 1}, false, {index, 2});
    CHECK(train.global_count == 15);
    CHECK(train.count == (index == 0 ? 8 : 7));
    for (int64_t e = 0; e < train.count; ++e)
      pixels.insert(train.bytes[static_cast<size_t>(e) * 36]);
  }
  CHECK(pixels.size() == 15);
  CHECK(std::set<int>(pixels.begin(), pixels.end()).size() == 15);
}

TEST_CASE("a folder source's bad config and bad files are errors naming them", "[folder]") {
  CHECK_THROWS_WITH(parse(R"({"source": "directory"})"), Contains("needs \"train_dir\""));
  CHECK_THROWS_WITH(parse(R"({"source": "directory", "train_dir": "x", "color_mode": "cmyk"})"),
                    Contains("color_mode"));
  CHECK_THROWS_WITH(parse(R"({"source": "directory", "train_dir": "x", "image_size": [0, 4]})"),
                    Contains("image_size"));
  CHECK_THROWS_WITH(parse(R"({"source": "idx", "train_dir": "x"})"),
                    Contains("only used with \"source\": \"directory\""));
  CHECK_THROWS_WITH(parse(R"({"source": "synthetic", "shard_policy": "file"})"),
                    Contains("synthetic"));
  CHECK_THROWS_WITH(parse(R"({"source": "idx", "shard_policy": "rows"})"),
                    Contains("shard_policy"));
  // Issue 43, item 11: "." is train_dir itself (every image again under one label), ".." its
  // parent (outside the data set): refused when the config is read, as a path is.
  for (const auto& [names, where] : {std::pair{R"([".", "cat"])", "class_names[0]"},
                                     {R"(["cat", ".."])", "class_names[1]"},
                                     {R"(["cat", "dog/.."])", "class_names[1]"}}) {
    CHECK_THROWS_WITH(
        folder_config("photos", std::string(R"(, "class_names": )") + names),
        Contains(std::string(where) + ": \"") && Contains("is not the name of a folder"));
  }
  CHECK_THROWS_WITH(folder_config("photos", R"(, "class_names": ["cat", "dog", "cat"])"),
                    Contains("class_names[2]: class \"cat\" is given twice"));
  Folders f;
  if (!f.ok) return;
  CHECK_THROWS_WITH(load_data(folder_config(f.dir.path() + "/mixed"), {6, 6, 1}, false),
                    Contains(f.dir.path() + "/mixed/b/x.png") && Contains("7"));
  auto [resized, unused] = load_data(
      folder_config(f.dir.path() + "/mixed", R"(, "image_size": [6, 6])"), {6, 6, 1}, false);
  CHECK(resized.count == 2);
  std::filesystem::create_directories(f.dir.path() + "/gray/empty");
  CHECK_THROWS_WITH(load_data(folder_config(f.dir.path() + "/gray"), {6, 6, 1}, false),
                    Contains("empty"));
}

TEST_CASE("a label at or above the model's classes names its source and example", "[folder]") {
  Dataset data;
  data.labels = {0, 3, 12, 4};
  data.labels_source = "data.npz: y_train";
  CHECK_NOTHROW(check_labels_below(data, 13));
  CHECK_THROWS_WITH(check_labels_below(data, 10),
                    Contains("data.npz: y_train: label 12 (example 2) is outside the model's 10"));
}

TEST_CASE("an image folder's shape and size are checked before any image is decoded", "[folder]") {
  // Issue 43, item 18: six 16000x16000 PNGs against input_shape [8, 8, 1] were all decoded
  // (2.9 GB) before the shape was compared. Here decoding any file is another error: the first
  // is cut short after its header, the others are not images at all.
  testing::TempDir dir;
  const std::string root = dir.path() + "/photos";
  write_file(root + "/a/0.png", png_header_only(16000, 16000));
  write_file(root + "/a/1.png", "not an image");
  write_file(root + "/b/0.png", "not an image");
  CHECK_THROWS_WITH(load_data(folder_config(root), {8, 8, 1}, false),
                    Contains("data: images in " + root +
                             " are 16000x16000x1 but model.input_shape is [8, 8, 1]") &&
                        Contains(root + "/a/0.png, the first image; give image_size"));
  CHECK_THROWS_WITH(load_data(parse(R"({"source": "directory", "train_dir": ")" + root + R"("})"),
                              {16000, 16000, 1}, false),
                    Contains("are 16000x16000x3 but model.input_shape is [16000, 16000, 1]"));
  CHECK_THROWS_WITH(load_data(folder_config(root, R"(, "image_size": [4, 4])"), {8, 8, 1}, false),
                    Contains("are 4x4x1 but model.input_shape is [8, 8, 1] (image_size"));

  // 4096 files resized to 8192x8192 RGBA: 1 TiB decoded, refused before anything is allocated
  // or decoded (the files are empty).
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (static_cast<double>(pages) * static_cast<double>(page) >= 0x1p40) {
    WARN("skipped: this machine has 1 TiB of memory or more");
    return;
  }
  const std::string many = dir.path() + "/many";
  for (int i = 0; i < 4096; ++i) write_file(fmt::format("{}/{}/{}.png", many, i % 2, i), "");
  CHECK_THROWS_WITH(
      load_data(parse(R"({"source": "directory", "train_dir": ")" + many +
                      R"(", "color_mode": "rgba", "image_size": [8192, 8192]})"),
                {8192, 8192, 4}, false),
      Contains(many + ": 4096 images of 8192x8192x4 take 1099511627776 bytes decoded, more than "
                      "the"));
}
