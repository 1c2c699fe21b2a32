// Image folders (worker/data/image_folder.h): the scan's order, labels and class_names against
// image_dataset_from_directory's rules, its errors, and the loader: the same bytes and the same
// first error with 1 and 4 threads, subsets by index, image_size, and mixed sizes refused.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "test/data/image_fixtures.h"
#include "test/support/temp_dir.h"
#include "worker/data/image_folder.h"

using namespace dtrain::data;
using Catch::Contains;
using dtrain::common::ConfigError;
using dtrain::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// Each spec "class/name:height:width:value" becomes a solid image of (value, value/2, 255-value);
// PIL picks PNG or JPEG from the name.
constexpr const char* kWriteImages = R"PY(
import os, sys
from PIL import Image
for spec in sys.argv[2:]:
    rel, h, w, v = spec.split(':')
    path = os.path.join(sys.argv[1], rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new('RGB', (int(w), int(h)), (int(v), int(v) // 2, 255 - int(v))).save(path)
)PY";

void touch(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << "x";
}

std::string scan_error(const std::string& dir, const std::vector<std::string>& names = {}) {
  try {
    scan_image_folder(dir, names);
  } catch (const ConfigError& error) {
    return error.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

std::string load_error(const ImageFolder& folder, const ImageLoadOptions& options) {
  try {
    load_images(folder, options);
  } catch (const ConfigError& error) {
    return error.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

std::vector<std::string> relative_paths(const ImageFolder& folder) {
  std::vector<std::string> out;
  for (const ImageFile& file : folder.files)
    out.push_back(fs::relative(file.path, folder.dir).string() + "=" + std::to_string(file.label));
  return out;
}

}  // namespace

TEST_CASE("scan: sorted classes, Keras's file order, other files ignored", "[images]") {
  TempDir tmp;
  const std::string root = tmp.path();
  for (const char* name :
       {"b_cat/z.jpg", "b_cat/a.JPEG", "a_dog/2.png", "a_dog/10.PNG", "a_dog/x.jpeg",
        "a_dog/notes.txt", "a_dog/2.png.bak", "a_dog/.3.png", "a_dog/sub/0.jpg",
        "a_dog/sub/.hidden/9.png", "a_dog/.ipynb_checkpoints/1.png", "a_dog/dir.png/inner.png",
        ".hidden/1.png", "readme.txt"})
    touch(root + "/" + name);
  const ImageFolder folder = scan_image_folder(root);
  CHECK(folder.class_names == std::vector<std::string>{"a_dog", "b_cat"});
  CHECK(relative_paths(folder) ==
        std::vector<std::string>{"a_dog/10.PNG=0", "a_dog/2.png=0", "a_dog/x.jpeg=0",
                                 "a_dog/dir.png/inner.png=0", "a_dog/sub/0.jpg=0", "b_cat/a.JPEG=1",
                                 "b_cat/z.jpg=1"});

  const ImageFolder given = scan_image_folder(root, {"b_cat", "a_dog"});
  CHECK(given.class_names == std::vector<std::string>{"b_cat", "a_dog"});
  CHECK(relative_paths(given).front() == "b_cat/a.JPEG=0");
  CHECK(relative_paths(given).back() == "a_dog/sub/0.jpg=1");
  CHECK(scan_image_folder(root, {"b_cat"}).files.size() == 2);
}

TEST_CASE("scan errors name the folder and what is wrong", "[images]") {
  TempDir tmp;
  const std::string root = tmp.path();
  touch(root + "/loose.png");
  CHECK_THAT(scan_error(root), Contains(root) && Contains("no class subfolders"));
  CHECK_THAT(scan_error(root + "/loose.png"), Contains("not a folder"));
  touch(root + "/cats/1.png");
  touch(root + "/dogs/notes.txt");
  CHECK_THAT(scan_error(root), Contains(root) && Contains("class folder \"dogs\" holds no"));
  CHECK_THAT(scan_error(root, {"cats", "birds"}),
             Contains("class \"birds\" has no folder " + root + "/birds"));
  CHECK_THAT(scan_error(root, {"cats", "cats"}), Contains("given twice"));
  CHECK_THAT(scan_error(root, {"../cats"}), Contains("not a folder name"));
  CHECK(scan_image_folder(root, {"cats"}).files.size() == 1);
}

TEST_CASE("a class folder whose name is not UTF-8 is refused, naming it", "[images]") {
  // Issue 43, item 10: a Latin-1 folder name trained, and model.json then held invalid UTF-8.
  TempDir tmp;
  const std::string root = tmp.path();
  touch(root + "/dog/1.png");
  touch(root + "/caf\xe9/1.png");        // Latin-1 e-acute
  touch(root + "/z\xed\xa0\x80/1.png");  // a UTF-16 surrogate, encoded
  touch(root + "/y\xc0\xaf/1.png");      // an overlong '/'
  CHECK_THAT(scan_error(root),
             Contains(root + ": class folder \"caf\\xe9\" has a name that is not UTF-8"));
  fs::remove_all(root + "/caf\xe9");
  CHECK_THAT(scan_error(root), Contains("class folder \"y\\xc0\\xaf\""));
  fs::remove_all(root + "/y\xc0\xaf");
  CHECK_THAT(scan_error(root), Contains("class folder \"z\\xed\\xa0\\x80\""));
  // Other UTF-8 is a name like any other, and class_names may leave a bad folder out.
  touch(root + "/caf\xc3\xa9/1.png");
  CHECK(scan_image_folder(root, {"caf\xc3\xa9", "dog"}).files.size() == 2);
  fs::remove_all(root + "/z\xed\xa0\x80");
  CHECK(scan_image_folder(root).class_names == std::vector<std::string>{"caf\xc3\xa9", "dog"});
}

TEST_CASE("load: one NHWC buffer, the same whatever the thread count", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  TempDir tmp;
  std::vector<std::string> specs;
  for (int i = 0; i < 12; ++i)
    specs.push_back("a/" + std::to_string(i) + ".png:3:4:" + std::to_string(i * 20));
  for (int i = 0; i < 5; ++i)
    specs.push_back("b/" + std::to_string(i) + ".jpg:3:4:" + std::to_string(i * 50));
  dtrain::testing::run_python(kWriteImages, [&] {
    std::vector<std::string> args = {tmp.path()};
    args.insert(args.end(), specs.begin(), specs.end());
    return args;
  }());
  const ImageFolder folder = scan_image_folder(tmp.path());
  REQUIRE(folder.files.size() == 17);

  const ImageArray one = load_images(folder, {ColorMode::kRgb, std::nullopt, 1});
  CHECK(one.count == 17);
  CHECK(one.height == 3);
  CHECK(one.width == 4);
  CHECK(one.channels == 3);
  REQUIRE(one.pixels.size() == 17 * 3 * 4 * 3);
  // Files sort as 0, 1, 10, 11, 2, ...: image 2 is a/10.png, value 200.
  CHECK(std::vector<uint8_t>(one.pixels.begin() + 2 * 36, one.pixels.begin() + 2 * 36 + 3) ==
        std::vector<uint8_t>{200, 100, 55});
  CHECK(one.labels == std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1});
  const ImageArray four = load_images(folder, {ColorMode::kRgb, std::nullopt, 4});
  CHECK(four.pixels == one.pixels);
  // The bound on the decoded total: exactly the pixels fit, one byte less does not.
  CHECK(load_images(folder, {ColorMode::kRgb, std::nullopt, 2, 17 * 36}).count == 17);
  CHECK_THAT(load_error(folder, {ColorMode::kRgb, std::nullopt, 2, 17 * 36 - 1}),
             Contains(tmp.path() + ": 17 images of 3x4x3 take 612 bytes decoded, more than the "
                                   "611 bytes"));
  CHECK(four.labels == one.labels);

  const ImageArray some =
      load_images(folder, {ColorMode::kRgb, std::nullopt, 4}, std::vector<size_t>{13, 2, 2});
  CHECK(some.count == 3);
  CHECK(some.labels == std::vector<int32_t>{1, 0, 0});
  CHECK(std::equal(some.pixels.begin(), some.pixels.begin() + 36, one.pixels.begin() + 13 * 36));
  CHECK(std::equal(some.pixels.begin() + 36, some.pixels.begin() + 72, one.pixels.begin() + 72));
  CHECK(std::equal(some.pixels.begin() + 72, some.pixels.end(), one.pixels.begin() + 72));

  const ImageArray gray = load_images(folder, {ColorMode::kGrayscale, ImageSize{5, 2}, 3});
  CHECK(gray.height == 5);
  CHECK(gray.width == 2);
  CHECK(gray.pixels.size() == 17 * 5 * 2);
  CHECK(load_images(folder, {ColorMode::kRgba, std::nullopt, 2}, std::vector<size_t>{}).count == 0);
}

TEST_CASE("load errors: the lowest failing file, whatever the thread count", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  TempDir tmp;
  std::vector<std::string> specs = {"a/0.png:3:4:10", "a/2.png:6:6:30", "b/0.png:5:5:40"};
  for (int i = 3; i < 20; ++i) specs.push_back("c/" + std::to_string(i) + ".png:3:4:9");
  std::vector<std::string> args = {tmp.path()};
  args.insert(args.end(), specs.begin(), specs.end());
  dtrain::testing::run_python(kWriteImages, args);
  const ImageFolder folder = scan_image_folder(tmp.path());
  for (int threads : {1, 4}) {
    INFO(threads << " threads");
    // Mixed sizes: the first file whose size differs (a/2.png, not b/0.png), both sizes.
    CHECK_THAT(load_error(folder, {ColorMode::kRgb, std::nullopt, threads}),
               Contains(tmp.path() + "/a/2.png: image is 6x6, expected 3x4 as " + tmp.path() +
                        "/a/0.png"));
    // With image_size all fit.
    CHECK(load_images(folder, {ColorMode::kRgb, ImageSize{3, 4}, threads}).count == 20);
  }
  // A file that does not decode, before the mixed sizes: it is the one reported.
  std::ofstream(tmp.path() + "/a/1.png") << "not an image";
  const ImageFolder damaged = scan_image_folder(tmp.path());
  for (int threads : {1, 4}) {
    INFO(threads << " threads");
    CHECK_THAT(load_error(damaged, {ColorMode::kRgb, std::nullopt, threads}),
               Contains(tmp.path() + "/a/1.png: not a PNG or JPEG file"));
    CHECK_THAT(load_error(damaged, {ColorMode::kRgb, ImageSize{2, 2}, threads}),
               Contains(tmp.path() + "/a/1.png: not a PNG or JPEG file"));
  }
}
