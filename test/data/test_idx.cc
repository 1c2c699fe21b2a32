// IDX files and datasets: real files written raw and gzipped into a temp folder, every kind of
// damage reported as a ConfigError naming the file and the problem, the `train.data` config,
// synthetic data (deterministic and learnable), and the real Fashion-MNIST files.
#include <sys/stat.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "test/support/config_error.h"
#include "test/support/temp_dir.h"
#include "worker/data/dataset.h"
#include "worker/data/idx_file.h"

using namespace dtrain::data;
using Catch::Contains;
using dtrain::common::ConfigError;
using dtrain::common::JsonDocument;
using dtrain::testing::TempDir;

using dtrain::testing::config_error;

namespace {

const std::string kFashionDir = "/usr/share/datasets/fashion-mnist";

std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                      const std::vector<uint8_t>& data) {
  std::string out;
  auto put = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  out.append(data.begin(), data.end());
  return out;
}

std::string write_raw(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string write_gz(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path() + "/" + name;
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
  return path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Three 2x2 images and their labels.
const std::vector<uint8_t> kPixels = {0, 255, 51, 102, 1, 2, 3, 4, 10, 20, 30, 40};
const std::vector<uint8_t> kLabels = {2, 0, 1};

std::string good_images() {
  return idx_bytes(kIdxImagesMagic, {3, 2, 2}, kPixels);
}
std::string good_labels() {
  return idx_bytes(kIdxLabelsMagic, {3}, kLabels);
}

}  // namespace

TEST_CASE("read_idx loads raw and gzipped files alike", "[idx]") {
  TempDir dir;
  for (bool gz : {false, true}) {
    auto write = gz ? write_gz : write_raw;
    std::string images = write(dir, gz ? "i.gz" : "i", good_images());
    std::string labels = write(dir, gz ? "l.gz" : "l", good_labels());
    IdxArray array = read_idx(images, IdxKind::kImages);
    CHECK(array.dims == std::vector<int64_t>{3, 2, 2});
    CHECK(array.data == kPixels);
    CHECK(read_idx(labels, IdxKind::kLabels).data == kLabels);

    Dataset data = load_idx_pair(images, labels);
    CHECK(data.count == 3);
    CHECK((data.height == 2 && data.width == 2 && data.channels == 1 && data.classes == 3));
    REQUIRE(data.pixel_count() == 12);
    CHECK(data.bytes == kPixels);  // kept as bytes
    CHECK(data.images.empty());
    CHECK(data.pixel(0) == 0.0f);
    CHECK(data.pixel(1) == 1.0f);
    CHECK(data.pixel(2) == Approx(0.2f));
    CHECK(data.pixel(3) == Approx(0.4f));
    float chw[4];
    copy_example_chw(data, 0, chw);  // what a batch gets: value / 255, as before
    for (int i = 0; i < 4; ++i) CHECK(chw[i] == static_cast<float>(kPixels[i]) / 255.0f);
    CHECK(data.labels == std::vector<int32_t>{2, 0, 1});
  }
}

TEST_CASE(
    "a gzip file's decompressed copy is cached, refreshed when the source changes, and "
    "remade when damaged",
    "[idx]") {
  TempDir dir, cache;
  const char* old_value = std::getenv("DTRAIN_CACHE_DIR");
  std::string saved = old_value ? old_value : "";
  ::setenv("DTRAIN_CACHE_DIR", cache.path().c_str(), 1);
  std::string images = write_gz(dir, "i.gz", good_images());
  auto cached = [&] {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(cache.path()))
      files.push_back(e.path().string());
    return files;
  };
  REQUIRE(cached().empty());
  CHECK(read_idx(images, IdxKind::kImages).data == kPixels);
  std::vector<std::string> files = cached();
  REQUIRE(files.size() == 1);
  CHECK(read_bytes(files[0]) == good_images());               // the decompressed file
  CHECK(read_idx(images, IdxKind::kImages).data == kPixels);  // served from the copy
  SECTION("a damaged copy is reported, thrown away and made again") {
    std::ofstream(files[0], std::ios::binary | std::ios::trunc) << "IDX?";
    CHECK(read_idx(images, IdxKind::kImages).data == kPixels);
    CHECK(read_bytes(files[0]) == good_images());
  }
  SECTION("a changed source gets a copy of its own") {
    std::vector<uint8_t> other = {9, 9, 9, 9};
    std::filesystem::remove(images);
    images = write_gz(dir, "i.gz", idx_bytes(kIdxImagesMagic, {1, 2, 2}, other));
    CHECK(read_idx(images, IdxKind::kImages).data == other);
  }
  SECTION("DTRAIN_CACHE_DIR=off: no copy") {
    ::setenv("DTRAIN_CACHE_DIR", "off", 1);
    std::filesystem::remove(files[0]);
    CHECK(read_idx(images, IdxKind::kImages).data == kPixels);
    CHECK(cached().empty());
  }
  if (old_value)
    ::setenv("DTRAIN_CACHE_DIR", saved.c_str(), 1);
  else
    ::unsetenv("DTRAIN_CACHE_DIR");
}

TEST_CASE("read_idx names the file and what is wrong with it", "[idx]") {
  TempDir dir;
  struct Case {
    const char* name;
    std::string bytes;
    IdxKind kind;
    const char* expected;
  };
  std::string truncated_gz = read_bytes(write_gz(dir, "whole.gz", good_images()));
  truncated_gz.resize(truncated_gz.size() / 2);
  const std::vector<uint8_t> nine_labels(9, 1), eleven_labels(11, 1);
  const Case cases[] = {
      {"bad magic", idx_bytes(0x00000804, {3}, kLabels), IdxKind::kLabels,
       "bad magic 0x00000804, expected 0x00000801 (labels)"},
      {"not idx", "hello world, no IDX here", IdxKind::kImages,
       "bad magic 0x68656c6c, expected 0x00000803 (images): not an IDX file"},
      {"wrong dims", idx_bytes(0x00000802, {3, 4}, kPixels), IdxKind::kImages,
       "bad magic 0x00000802, expected 0x00000803 (images): the file has 2 dimensions"},
      {"labels as images", good_labels(), IdxKind::kImages,
       "bad magic 0x00000801, expected 0x00000803 (images): the file has 1 dimension,"},
      {"truncated labels", idx_bytes(kIdxLabelsMagic, {10}, nine_labels), IdxKind::kLabels,
       "truncated: header says 10 labels, file has 9"},
      {"truncated images", idx_bytes(kIdxImagesMagic, {4, 2, 2}, kPixels), IdxKind::kImages,
       "truncated: header says 4 images of 2x2 (16 bytes), file has 12 bytes"},
      {"trailing bytes", idx_bytes(kIdxLabelsMagic, {10}, eleven_labels), IdxKind::kLabels,
       "trailing bytes: header says 10 labels, file has 11 (1 too many)"},
      {"short header", std::string("\0\0\x08\x03\0\0", 6), IdxKind::kImages,
       "truncated: the header needs 16 bytes, file has 6"},
      {"zero dimension", idx_bytes(kIdxImagesMagic, {3, 0, 2}, {}), IdxKind::kImages,
       "dimension 1 of the header is 0"},
      {"empty", "", IdxKind::kLabels, "too short for an IDX file (0 bytes)"},
      {"bad gzip", std::string("\x1f\x8b\x08\0garbage-garbage-garbage", 27), IdxKind::kLabels,
       "not a valid gzip stream"},
      {"truncated gzip", truncated_gz, IdxKind::kImages, "not a valid gzip stream (truncated)"},
  };
  for (const Case& c : cases) {
    SECTION(c.name) {
      const std::string path = write_raw(dir, "bad-file", c.bytes);
      CHECK_THAT(config_error([&] { read_idx(path, c.kind); }),
                 Catch::StartsWith(path + ": " + c.expected));
    }
  }
  SECTION("garbage after a gzip stream") {
    std::string bytes = read_bytes(write_gz(dir, "ok.gz", good_labels())) + "junk";
    const std::string path = write_raw(dir, "junk.gz", bytes);
    REQUIRE_THAT(config_error([&] { read_idx(path, IdxKind::kLabels); }),
                 Contains(path) && Contains("4 unexpected bytes after the gzip stream"));
  }
  SECTION("missing file") {
    const std::string path = dir.path() + "/no-such-file.gz";
    REQUIRE_THAT(config_error([&] { read_idx(path, IdxKind::kLabels); }),
                 Contains(path + ": cannot open (No such file or directory)"));
  }
}

TEST_CASE("a gzip file's header is checked before the rest is inflated", "[idx]") {
  TempDir dir;
  // A bomb: a bad magic, then 16 MiB of zeros (16 KB packed), and a damaged gzip trailer. Only
  // inflating everything would reach the trailer; the magic must be refused first.
  std::string bytes = "IDX?" + std::string(size_t{16} << 20, '\0');
  std::string packed = read_bytes(write_gz(dir, "bomb.gz", bytes));
  REQUIRE(packed.size() < (size_t{64} << 10));
  packed[packed.size() - 8] ^= 0x55;  // the CRC-32 of the whole stream
  const std::string path = write_raw(dir, "bomb-bad-crc.gz", packed);
  CHECK_THAT(config_error([&] { read_idx(path, IdxKind::kLabels); }),
             Catch::StartsWith(path + ": bad magic 0x4944583f"));
  // Likewise a header that is fine but promises less than the stream holds: the data it
  // promises is read, and the rest is only counted.
  std::vector<uint8_t> ten(10, 1);
  std::string labels = idx_bytes(kIdxLabelsMagic, {10}, ten) + std::string(size_t{8} << 20, '\0');
  const std::string trailing = write_gz(dir, "trailing.gz", labels);
  CHECK_THAT(config_error([&] { read_idx(trailing, IdxKind::kLabels); }),
             Catch::StartsWith(trailing + ": trailing bytes: header says 10 labels, file has " +
                               std::to_string(10 + (8 << 20))));
}

TEST_CASE("a data file that is a FIFO, a device or a folder is refused at once", "[idx]") {
  TempDir dir;
  const std::string fifo = dir.path() + "/train-labels-idx1-ubyte";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(config_error([&] { read_idx(fifo, IdxKind::kLabels); }),
             Catch::StartsWith(fifo + ": not a regular file (a FIFO)"));
  CHECK_THAT(config_error([&] { read_idx("/dev/zero", IdxKind::kImages); }),
             Catch::StartsWith("/dev/zero: not a regular file (a device or socket)"));
  CHECK_THAT(config_error([&] { read_idx(dir.path(), IdxKind::kImages); }),
             Catch::StartsWith(dir.path() + ": not a regular file (a folder)"));
}

TEST_CASE("load_idx_pair checks that images and labels belong together", "[idx]") {
  TempDir dir;
  const std::string images = write_raw(dir, "images", good_images());
  SECTION("count mismatch names both files") {
    const std::string labels = write_raw(dir, "labels", idx_bytes(kIdxLabelsMagic, {2}, {1, 0}));
    REQUIRE_THAT(config_error([&] { load_idx_pair(images, labels); }),
                 Contains(images + " has 3 images but " + labels + " has 2 labels"));
  }
  SECTION("swapped files") {
    const std::string labels = write_raw(dir, "labels", good_labels());
    REQUIRE_THAT(config_error([&] { load_idx_pair(labels, images); }),
                 Contains(labels + ": bad magic") && Contains("(images)"));
  }
  SECTION("a single class") {
    const std::string labels = write_raw(dir, "labels", idx_bytes(kIdxLabelsMagic, {3}, {0, 0, 0}));
    REQUIRE_THAT(config_error([&] { load_idx_pair(images, labels); }),
                 Contains(labels + ": all labels are 0"));
  }
  SECTION("a single class is fine in a test split") {
    const std::string labels = write_raw(dir, "labels", idx_bytes(kIdxLabelsMagic, {3}, {0, 0, 0}));
    Dataset test = load_idx_pair(images, labels, Split::kTest);
    CHECK((test.count == 3 && test.classes == 1));
  }
}

// Issue 25 (19): a test split whose labels are all one class was refused like a training split.
TEST_CASE("load_data accepts a test split of one class, not a train split of one", "[idx]") {
  TempDir dir;
  const std::vector<uint8_t> zeros = {0, 0, 0};
  write_raw(dir, "train-images-idx3-ubyte", good_images());
  write_raw(dir, "t10k-images-idx3-ubyte", good_images());
  DataConfig config;
  config.dir = dir.path();
  SECTION("test split of one class") {
    write_raw(dir, "train-labels-idx1-ubyte", good_labels());
    write_raw(dir, "t10k-labels-idx1-ubyte", idx_bytes(kIdxLabelsMagic, {3}, zeros));
    auto [train, test] = load_data(config, {2, 2, 1});
    CHECK((train.classes == 3 && test.classes == 3));  // both splits: the model's classes
    CHECK(test.labels == std::vector<int32_t>(zeros.begin(), zeros.end()));
  }
  SECTION("train split of one class") {
    const std::string labels =
        write_raw(dir, "train-labels-idx1-ubyte", idx_bytes(kIdxLabelsMagic, {3}, zeros));
    write_raw(dir, "t10k-labels-idx1-ubyte", good_labels());
    CHECK_THAT(config_error([&] {
                 load_data(config, {2, 2, 1});
               }),
               Contains(labels + ": all labels are 0"));
  }
}

TEST_CASE("parse_data_config reads train.data with Keras-ish defaults", "[idx]") {
  auto parse = [](const std::string& text) {
    JsonDocument doc = JsonDocument::parse(R"({"data": )" + text + "}", "job.json");
    return parse_data_config(doc.root().at("data"));
  };
  DataConfig defaults = parse("{}");
  CHECK(defaults.source == "idx");
  CHECK(defaults.dir == kFashionDir);
  CHECK(defaults.train_images.empty());
  DataConfig idx = parse(R"({"dir": "/d", "test_labels": "/x/labels.gz"})");
  CHECK((idx.dir == "/d" && idx.test_labels == "/x/labels.gz"));
  DataConfig synthetic = parse(R"({"source": "synthetic", "examples": 64, "classes": 3})");
  CHECK((synthetic.source == "synthetic" && synthetic.examples == 64 && synthetic.classes == 3));

  CHECK_THAT(config_error([&] { parse(R"({"sorce": "idx"})"); }),
             Contains("data: unknown key \"sorce\""));
  CHECK_THAT(config_error([&] { parse(R"({"source": "csv"})"); }),
             Contains("data.source: unknown data source"));
  CHECK_THAT(config_error([&] { parse(R"({"examples": 10})"); }),
             Contains("data.examples: only used with \"source\": \"synthetic\""));
  CHECK_THAT(config_error([&] { parse(R"({"source": "synthetic", "dir": "/d"})"); }),
             Contains("data.dir: only used with \"source\": \"idx\""));
  CHECK_THAT(config_error([&] { parse(R"({"source": "synthetic", "classes": 1})"); }),
             Contains("data.classes"));
}

TEST_CASE("load_data finds files in dir and checks the model's input shape", "[idx]") {
  TempDir dir;
  write_raw(dir, "train-images-idx3-ubyte", good_images());
  write_gz(dir, "train-images-idx3-ubyte.gz", idx_bytes(kIdxImagesMagic, {1, 1, 1}, {0}));
  write_gz(dir, "train-labels-idx1-ubyte.gz", good_labels());
  write_raw(dir, "t10k-images-idx3-ubyte", good_images());
  DataConfig config;
  config.dir = dir.path();
  CHECK_THAT(config_error([&] { resolve_idx_paths(config); }),
             Contains("data: neither " + dir.path() + "/t10k-labels-idx1-ubyte nor"));
  config.test_labels = write_raw(dir, "elsewhere", good_labels());
  DataConfig paths = resolve_idx_paths(config);
  CHECK(paths.train_images == dir.path() + "/train-images-idx3-ubyte");  // plain before .gz
  CHECK(paths.train_labels == dir.path() + "/train-labels-idx1-ubyte.gz");
  CHECK(paths.test_labels == dir.path() + "/elsewhere");

  auto [train, test] = load_data(config, {2, 2, 1});
  CHECK((train.count == 3 && test.count == 3 && train.classes == 3));
  CHECK_THAT(config_error([&] {
               load_data(config, {32, 32, 3});
             }),
             Contains("data: images are 2x2x1 but model.input_shape is [32, 32, 3]"));
  CHECK_THAT(config_error([&] {
               load_data(config, {2, 2});
             }),
             Contains("model.input_shape must be"));
}

TEST_CASE("synthetic data is deterministic and learnable", "[idx]") {
  Dataset a = make_synthetic(200, 4, 5, 5, 2, 7);
  CHECK(a.images == make_synthetic(200, 4, 5, 5, 2, 7).images);
  CHECK(a.images != make_synthetic(200, 4, 5, 5, 2, 8).images);
  for (float v : a.images) REQUIRE((v >= 0.0f && v <= 1.0f));
  CHECK(a.labels[5] == 1);
  Dataset tail = make_synthetic(20, 4, 5, 5, 2, 7, 180);  // examples 180.. of the same stream
  CHECK(std::vector<float>(a.images.end() - 20 * 50, a.images.end()) == tail.images);

  // A nearest-class-mean classifier fit on one split labels another split it never saw.
  DataConfig config;
  config.source = "synthetic";
  config.examples = 400;
  config.classes = 10;
  auto [train, test] = load_data(config, {6, 6, 1});
  CHECK((train.count == 400 && test.count == 100 && test.classes == 10));
  std::vector<double> means(10 * 36, 0.0);
  for (int64_t i = 0; i < train.count; ++i)
    for (int p = 0; p < 36; ++p) means[train.labels[i] * 36 + p] += train.images[i * 36 + p] / 40;
  int correct = 0;
  for (int64_t i = 0; i < test.count; ++i) {
    int best = 0;
    double best_distance = 1e30;
    for (int k = 0; k < 10; ++k) {
      double distance = 0;
      for (int p = 0; p < 36; ++p) {
        double d = test.images[i * 36 + p] - means[k * 36 + p];
        distance += d * d;
      }
      if (distance < best_distance) {
        best_distance = distance;
        best = k;
      }
    }
    correct += best == test.labels[i];
  }
  CHECK(correct >= 98);
}

TEST_CASE("the real Fashion-MNIST files load", "[idx][fashion]") {
  const std::string labels_path = kFashionDir + "/t10k-labels-idx1-ubyte.gz";
  Dataset test = load_idx_pair(kFashionDir + "/t10k-images-idx3-ubyte.gz", labels_path);
  CHECK((test.count == 10000 && test.height == 28 && test.width == 28 && test.channels == 1));
  CHECK(test.classes == 10);

  // The same labels read independently: 8 header bytes, then one byte per label.
  gzFile file = gzopen(labels_path.c_str(), "rb");
  REQUIRE(file != nullptr);
  unsigned char raw[8 + 32];
  REQUIRE(gzread(file, raw, sizeof raw) == static_cast<int>(sizeof raw));
  gzclose(file);
  for (int i = 0; i < 32; ++i) CHECK(test.labels[i] == raw[8 + i]);
  CHECK(test.labels[0] == 9);  // the first test image is an ankle boot

  DataConfig config;  // the defaults: idx files in the Fashion-MNIST folder
  auto [train, unused] = load_data(config, {28, 28, 1});
  CHECK((train.count == 60000 && train.classes == 10 && train.pixel_count() == 60000u * 784));
}
