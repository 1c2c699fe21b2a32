// The npz and npy data sources on files written by real NumPy (/usr/bin/python3, Debian's
// python3-numpy): np.savez and np.savez_compressed, uint8 and float32 images, 3-D and 4-D, labels
// of several integer dtypes, the checks that tie arrays to each other and to the model, and
// Fashion-MNIST saved as .npz loading to exactly what the IDX files give. Hand-made damaged files
// are test_npy_damaged.cc's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "test/support/config_error.h"
#include "test/support/python.h"
#include "test/support/temp_dir.h"
#include "worker/data/dataset.h"
#include "worker/data/npy_file.h"
#include "worker/data/npz_file.h"

using namespace dtrain::data;
using Catch::Contains;
using dtrain::common::ConfigError;
using dtrain::common::JsonDocument;
using dtrain::testing::TempDir;

using dtrain::testing::config_error;

namespace {

// Runs a Python program (numpy imported as np) in dir; false (with a WARN) when there is no NumPy.
bool numpy(const TempDir& dir, const std::string& program) {
  if (!dtrain::testing::python_imports("numpy")) {
    WARN("skipped: " << dtrain::testing::kSystemPython << " cannot import numpy");
    return false;
  }
  dtrain::testing::ProcessOptions options;
  options.cwd = dir.path();
  auto r = dtrain::testing::run_process(
      {dtrain::testing::kSystemPython, "-c", "import numpy as np\n" + program}, options);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return true;
}

// The arrays every test writes: pixel i of the uint8 images is (7 i + 3) % 256, of the float32
// ones (i % 97) / 96; label i is i % 3.
const char* kArrays = R"(
def u8(*shape): return ((np.arange(np.prod(shape)) * 7 + 3) % 256).astype(np.uint8).reshape(shape)
def f4(*shape): return ((np.arange(np.prod(shape)) % 97) / 96.0).astype(np.float32).reshape(shape)
def lab(n, dtype): return (np.arange(n) % 3).astype(dtype)
)";

uint8_t u8(size_t i) {
  return static_cast<uint8_t>((i * 7 + 3) % 256);
}
float f4(size_t i) {
  return static_cast<float>(static_cast<double>(i % 97) / 96.0);
}

void check_u8(const Dataset& data, int64_t count, int h, int w, int c) {
  CHECK((data.count == count && data.height == h && data.width == w && data.channels == c));
  REQUIRE(data.pixel_count() == static_cast<size_t>(count * h * w * c));
  CHECK(data.images.empty());
  CHECK(data.bytes.empty());  // shared with the reader, not copied
  REQUIRE(data.shared_bytes);
  for (size_t i = 0; i < data.pixel_count(); ++i) REQUIRE(data.byte_data()[i] == u8(i));
  for (int64_t i = 0; i < count; ++i) REQUIRE(data.labels[static_cast<size_t>(i)] == i % 3);
}

void check_f4(const Dataset& data, int64_t count, int h, int w, int c) {
  CHECK((data.count == count && data.height == h && data.width == w && data.channels == c));
  REQUIRE(data.images.size() == static_cast<size_t>(count * h * w * c));
  CHECK(!data.has_bytes());
  for (size_t i = 0; i < data.images.size(); ++i) REQUIRE(data.images[i] == f4(i));
  for (int64_t i = 0; i < count; ++i) REQUIRE(data.labels[static_cast<size_t>(i)] == i % 3);
}

DataConfig npz_config(const TempDir& dir, const std::string& name) {
  DataConfig config;
  config.source = "npz";
  config.path = dir.path() + "/" + name;
  return config;
}

}  // namespace

TEST_CASE("np.savez and np.savez_compressed archives load as NumPy wrote them", "[npy]") {
  TempDir dir;
  if (!numpy(dir, std::string(kArrays) + R"(
for save, name in ((np.savez, 'stored.npz'), (np.savez_compressed, 'deflated.npz')):
    save(name, x_train=u8(7, 3, 4), y_train=lab(7, np.int64), x_test=u8(5, 3, 4),
         y_test=lab(5, np.uint8))
    save('f' + name, images=f4(6, 3, 4, 2), labels=lab(6, np.int16).reshape(6, 1),
         x_test=f4(4, 3, 4, 2), y_test=lab(4, np.uint32))
)"))
    return;
  for (const std::string name : {"stored.npz", "deflated.npz"}) {
    INFO(name);
    auto [train, test] = load_data(npz_config(dir, name), {3, 4, 1});
    check_u8(train, 7, 3, 4, 1);
    check_u8(test, 5, 3, 4, 1);
    CHECK((train.classes == 3 && test.classes == 3));
    CHECK(train.pixel(1) == static_cast<float>(u8(1)) / 255.0f);  // bytes scaled when copied out

    DataConfig floats = npz_config(dir, "f" + name);
    floats.x_train = "images";
    floats.y_train = "labels";
    auto [ftrain, ftest] = load_data(floats, {3, 4, 2});
    check_f4(ftrain, 6, 3, 4, 2);
    check_f4(ftest, 4, 3, 4, 2);
    float chw[3 * 4 * 2];
    copy_example_chw(ftrain, 1, chw);  // NHWC in the file, CHW in a batch
    CHECK(chw[1 * 12 + 5] == f4(24 + 5 * 2 + 1));

    NpzFile archive(dir.path() + "/" + name);
    CHECK(archive.keys() == std::vector<std::string>{"x_train", "y_train", "x_test", "y_test"});
  }
}

// Issue 46, item 5: what Keras takes. x / 255.0 makes float64 images, cast to float32 as Keras
// casts to floatx; float labels holding class indices are taken as those indices.
TEST_CASE("float64 images and float labels holding class indices load as Keras casts them",
          "[npy]") {
  TempDir dir;
  if (!numpy(dir, std::string(kArrays) + R"(
np.savez('f8.npz', x_train=f4(6, 3, 4, 2).astype(np.float64), y_train=lab(6, np.float32),
         x_test=f4(4, 3, 4, 2).astype(np.float64) / 3, y_test=lab(4, np.float64))
)"))
    return;
  auto [train, test] = load_data(npz_config(dir, "f8.npz"), {3, 4, 2});
  check_f4(train, 6, 3, 4, 2);
  REQUIRE(test.images.size() == 4 * 3 * 4 * 2);
  for (size_t i = 0; i < test.images.size(); ++i)
    REQUIRE(test.images[i] == static_cast<float>(static_cast<double>(f4(i)) / 3));
  for (int64_t i = 0; i < 4; ++i) REQUIRE(test.labels[static_cast<size_t>(i)] == i % 3);
}

TEST_CASE("the npy source reads one array per file, the test split only when needed", "[npy]") {
  TempDir dir;
  if (!numpy(dir, std::string(kArrays) + R"(
np.save('xtr.npy', f4(6, 2, 3)); np.save('ytr.npy', lab(6, np.uint8))
np.save('xte.npy', u8(3, 2, 3, 1)); np.save('yte.npy', lab(3, np.int8))
)"))
    return;
  DataConfig config;
  config.source = "npy";
  config.train_images = dir.path() + "/xtr.npy";
  config.train_labels = dir.path() + "/ytr.npy";
  SECTION("without validation no test arrays are needed") {
    auto [train, test] = load_data(config, {2, 3, 1}, /*need_test=*/false);
    check_f4(train, 6, 2, 3, 1);
    CHECK((test.count == 0 && test.labels.empty() && test.classes == 3));
    CHECK_THAT(config_error([&] {
                 load_data(config, {2, 3, 1});
               }),
               Contains("needs \"test_images\" and \"test_labels\""));
  }
  SECTION("with validation, uint8 and float32 splits side by side") {
    config.test_images = dir.path() + "/xte.npy";
    config.test_labels = dir.path() + "/yte.npy";
    auto [train, test] = load_data(config, {2, 3, 1});
    check_f4(train, 6, 2, 3, 1);
    check_u8(test, 3, 2, 3, 1);
  }
  SECTION("an npz without its test arrays trains without validation") {
    REQUIRE(numpy(dir, std::string(kArrays) +
                           "np.savez('t.npz', x_train=u8(6, 2, 3), y_train=lab(6, np.int64))"));
    auto [train, test] = load_data(npz_config(dir, "t.npz"), {2, 3, 1}, false);
    check_u8(train, 6, 2, 3, 1);
    CHECK(test.count == 0);
    CHECK_THAT(config_error([&] {
                 load_data(npz_config(dir, "t.npz"), {2, 3, 1});
               }),
               Contains(dir.path() + "/t.npz: x_test: no such array in the archive (it has: "
                                     "x_train, y_train)"));
  }
}

TEST_CASE("arrays that do not belong together are refused, naming file, key and problem", "[npy]") {
  TempDir dir;
  if (!numpy(dir, std::string(kArrays) + R"(
np.savez('a.npz', x_train=u8(6, 2, 3), y_train=lab(5, np.int64), x_test=u8(2, 2, 3),
         y_test=lab(2, np.int64), f8=np.zeros((6, 2, 3)), one=np.zeros(6, np.uint8),
         neg=np.array([0, 1, -1, 2, 0, 1]), big=np.array([0, 1, 2, 2**40, 0, 1]),
         flat=u8(6, 6), fx=f4(6, 2, 3), y6=lab(6, np.int64), big_u8=lab(6, np.uint64),
         fortran=np.asfortranarray(u8(6, 2, 3)), be=lab(6, '>i4'),
         i2=np.zeros((6, 2, 3), np.int16), halves=np.array([0, 0.5, 1, 2, 0, 1]))
)"))
    return;
  const std::string file = dir.path() + "/a.npz";
  DataConfig config = npz_config(dir, "a.npz");
  auto error = [&](const std::string& x, const std::string& y, std::vector<int> shape = {2, 3, 1}) {
    DataConfig c = config;
    c.x_train = x;
    c.y_train = y;
    return config_error([&] { load_data(c, shape, false); });
  };
  CHECK_THAT(error("x_train", "y_train"),
             Contains(file + ": x_train has 6 images but " + file + ": y_train has 5 labels"));
  CHECK_THAT(error("i2", "y6"),
             Contains(file + ": i2: dtype '<i2' is not supported (images: uint8, float32, or "
                             "float64 (cast to float32))"));
  CHECK_THAT(error("fx", "halves"),
             Contains(file + ": halves: label 0.5 at index 1 is not a class index (a whole "
                             "number from 0): float labels must hold class indices"));
  CHECK_THAT(error("nope", "y6"),
             Contains(file + ": nope: no such array in the archive (it has: x_train, y_train, "
                             "x_test, y_test, f8, one"));
  CHECK_THAT(error("fx", "one"),
             Contains(file + ": one: all labels are 0; a classifier needs at least 2 classes"));
  CHECK_THAT(error("fx", "neg"), Contains(file + ": neg: label -1 at index 2 is negative"));
  CHECK_THAT(error("fx", "big"),
             Contains(file + ": big: label 1099511627776 at index 3 is too large for int32"));
  // (N, F) rows are tabular inputs: F features, which this model's input_shape does not take.
  CHECK_THAT(error("flat", "y6"),
             Contains("data: images are 6 features but model.input_shape is [2, 3, 1]"));
  CHECK_THAT(error("fortran", "y6"), Contains(file + ": fortran: bad .npy header: fortran_order"));
  CHECK_THAT(error("fx", "be"), Contains(file + ": be: dtype '>i4' is big-endian"));
  CHECK_THAT(
      error("fx", "y6", {3, 2, 1}),
      Contains("data: images are 2x3x1 but model.input_shape is [3, 2, 1] (" + file + ": fx)"));
  auto [train, test] = load_data(
      [&] {
        DataConfig c = config;
        c.x_train = "fx";
        c.y_train = "big_u8";  // uint64 labels that fit
        return c;
      }(),
      {2, 3, 1});
  CHECK((train.classes == 3 && test.count == 2));
}

TEST_CASE("parse_data_config reads the npz and npy sources", "[npy]") {
  auto parse = [](const std::string& text) {
    JsonDocument doc = JsonDocument::parse(R"({"data": )" + text + "}", "job.json");
    return parse_data_config(doc.root().at("data"));
  };
  DataConfig npz = parse(R"({"source": "npz", "path": "/d/mnist.npz", "y_test": "labels"})");
  CHECK((npz.source == "npz" && npz.path == "/d/mnist.npz" && npz.x_train == "x_train" &&
         npz.y_train == "y_train" && npz.x_test == "x_test" && npz.y_test == "labels"));
  DataConfig npy = parse(R"({"source": "npy", "train_images": "a.npy", "train_labels": "b.npy"})");
  CHECK((npy.train_images == "a.npy" && npy.train_labels == "b.npy" && npy.test_images.empty()));
  CHECK_THAT(config_error([&] { parse(R"({"source": "npz"})"); }),
             Contains("data: \"source\": \"npz\" needs \"path\""));
  CHECK_THAT(config_error([&] { parse(R"({"source": "npy", "train_images": "a.npy"})"); }),
             Contains("needs \"train_images\" and \"train_labels\""));
  CHECK_THAT(config_error([&] { parse(R"({"source": "npz", "path": "p", "dir": "/d"})"); }),
             Contains("data.dir: only used with \"source\": \"idx\""));
  CHECK_THAT(config_error([&] { parse(R"({"path": "p"})"); }),
             Contains("data.path: only used with \"source\": \"npz\""));
  CHECK_THAT(config_error([&] { parse(R"({"source": "npz", "path": "p", "test_images": "t"})"); }),
             Contains("data.test_images: only used with \"source\": \"idx\" or \"npy\""));
  CHECK_THAT(config_error([&] { parse(R"({"source": "npz", "path": ""})"); }),
             Contains("data.path"));
}

TEST_CASE("Fashion-MNIST saved as .npz loads to exactly what the IDX files give",
          "[npy][fashion]") {
  TempDir dir;
  const std::string fashion = "/usr/share/datasets/fashion-mnist";
  if (!numpy(dir, R"(
import gzip
def read(name, offset):
    with gzip.open(')" +
                      fashion + R"(/' + name, 'rb') as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)
np.savez('fashion.npz', x_train=read('train-images-idx3-ubyte.gz', 16).reshape(-1, 28, 28),
         y_train=read('train-labels-idx1-ubyte.gz', 8).astype(np.int64),
         x_test=read('t10k-images-idx3-ubyte.gz', 16).reshape(-1, 28, 28),
         y_test=read('t10k-labels-idx1-ubyte.gz', 8))
)"))
    return;
  auto [train, test] = load_data(npz_config(dir, "fashion.npz"), {28, 28, 1});
  Dataset idx_train = load_idx_pair(fashion + "/train-images-idx3-ubyte.gz",
                                    fashion + "/train-labels-idx1-ubyte.gz");
  Dataset idx_test = load_idx_pair(fashion + "/t10k-images-idx3-ubyte.gz",
                                   fashion + "/t10k-labels-idx1-ubyte.gz", Split::kTest);
  CHECK((train.count == 60000 && test.count == 10000 && train.classes == 10));
  auto same_bytes = [](const Dataset& a, const Dataset& b) {
    return a.pixel_count() == b.pixel_count() &&
           std::equal(a.byte_data(), a.byte_data() + a.pixel_count(), b.byte_data());
  };
  CHECK(same_bytes(train, idx_train));  // CHECK, not a loop: one comparison of 47 MB
  CHECK(train.labels == idx_train.labels);
  CHECK(same_bytes(test, idx_test));
  CHECK(test.labels == idx_test.labels);
}
