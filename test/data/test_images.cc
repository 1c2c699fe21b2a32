// PNG and JPEG decoding (worker/data/image_decode.h) against PIL's decode of the same files, the
// color conversions, TF's half-pixel bilinear resize against a reference written here, and every
// kind of damaged or hostile file reported as a ConfigError naming it. Folders: test_image_folder.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "test/data/image_fixtures.h"
#include "test/support/temp_dir.h"
#include "worker/data/image_decode.h"

using namespace dtrain::data;
using Catch::Contains;
using dtrain::common::ConfigError;
using dtrain::testing::file_bytes;
using dtrain::testing::TempDir;

namespace {

// A folder of fixtures (image_fixtures.h), made once per test case.
struct Fixtures {
  TempDir dir;
  Fixtures() { dtrain::testing::run_python(dtrain::testing::kImageFixtures, {dir.path()}); }
  std::string path(const std::string& name) const { return dir.path() + "/" + name; }
  std::vector<uint8_t> raw(const std::string& name) const { return file_bytes(path(name)); }
  Image decode(const std::string& name, ColorMode mode) const {
    return decode_image_file(path(name), mode);
  }
};

int max_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  REQUIRE(a.size() == b.size());
  int worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(int{a[i]} - int{b[i]}));
  return worst;
}

std::vector<uint8_t> tf_gray(const std::vector<uint8_t>& rgb) {
  std::vector<uint8_t> gray;
  for (size_t i = 0; i + 2 < rgb.size(); i += 3)
    gray.push_back(static_cast<uint8_t>(
        std::lround(0.2989 * rgb[i] + 0.5870 * rgb[i + 1] + 0.1140 * rgb[i + 2])));
  return gray;
}

// Every n-th byte from offset: one channel of interleaved pixels.
std::vector<uint8_t> channel(const std::vector<uint8_t>& pixels, int n, int offset) {
  std::vector<uint8_t> out;
  for (size_t i = static_cast<size_t>(offset); i < pixels.size(); i += static_cast<size_t>(n))
    out.push_back(pixels[i]);
  return out;
}

std::string config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& error) {
    return error.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

}  // namespace

TEST_CASE("gray PNG: exact round trip, replicated to RGB, alpha 255", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  Fixtures f;
  const Image gray = f.decode("gray.png", ColorMode::kGrayscale);
  CHECK(gray.height == 7);
  CHECK(gray.width == 5);
  CHECK(gray.channels == 1);
  CHECK(gray.pixels == f.raw("gray.raw"));
  const Image rgba = f.decode("gray.png", ColorMode::kRgba);
  REQUIRE(rgba.pixels.size() == 7 * 5 * 4);
  for (int c = 0; c < 3; ++c) CHECK(channel(rgba.pixels, 4, c) == f.raw("gray.raw"));
  CHECK(channel(rgba.pixels, 4, 3) == std::vector<uint8_t>(35, 255));
  CHECK(f.decode("gray.png", ColorMode::kRgb).pixels.size() == 7 * 5 * 3);
}

TEST_CASE("RGB PNG: exact, and grayscale by TF's weights within 1 of PIL's", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  Fixtures f;
  const Image rgb = f.decode("rgb.png", ColorMode::kRgb);
  CHECK(rgb.height == 5);
  CHECK(rgb.width == 7);
  CHECK(rgb.pixels == f.raw("rgb.raw"));
  const Image gray = f.decode("rgb.png", ColorMode::kGrayscale);
  CHECK(gray.pixels == tf_gray(rgb.pixels));  // rounded as the header says
  CHECK(max_difference(gray.pixels, f.raw("rgb_L.raw")) <= 1);
}

TEST_CASE("RGBA, palette, 1-bit and 16-bit PNGs", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  Fixtures f;
  const std::vector<uint8_t> rgba = f.raw("rgba.raw");
  CHECK(f.decode("rgba.png", ColorMode::kRgba).pixels == rgba);
  const Image rgb = f.decode("rgba.png", ColorMode::kRgb);  // alpha dropped, not composited
  for (int c = 0; c < 3; ++c) CHECK(channel(rgb.pixels, 3, c) == channel(rgba, 4, c));
  CHECK(f.decode("rgba.png", ColorMode::kGrayscale).pixels == tf_gray(rgb.pixels));
  CHECK(f.decode("pal.png", ColorMode::kRgb).pixels == f.raw("pal_rgb.raw"));
  CHECK(f.decode("pal_t.png", ColorMode::kRgba).pixels == f.raw("pal_t.raw"));  // tRNS as alpha
  CHECK(f.decode("bit1.png", ColorMode::kGrayscale).pixels == f.raw("bit1_L.raw"));  // 0 or 255
  const Image deep = f.decode("rgb16.png", ColorMode::kRgb);
  CHECK(deep.height == 3);
  CHECK(deep.width == 4);
  CHECK(deep.pixels == f.raw("rgb16.raw"));  // the high byte of each sample
}

// Both sides run Debian's libjpeg-turbo with its accurate integer IDCT and fancy upsampling, so
// the decode is expected to be exact; 1 level of tolerance allows another SIMD build of it.
// Grayscale is the luma plane, on both sides (PIL's draft("L")); TF's formula on the decoded RGB
// is within 1 of it, except where saturated colors clipped in RGB (up to 5 levels in this image).
TEST_CASE("JPEG decodes as PIL does: baseline, progressive, grayscale", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  Fixtures f;
  for (const std::string name : {"photo", "progressive"}) {
    INFO(name);
    const Image rgb = f.decode(name + ".jpg", ColorMode::kRgb);
    CHECK(rgb.height == 24);
    CHECK(rgb.width == 40);
    CHECK(max_difference(rgb.pixels, f.raw(name + "_rgb.raw")) <= 1);
    const Image gray = f.decode(name + ".jpg", ColorMode::kGrayscale);
    CHECK(max_difference(gray.pixels, f.raw(name + "_L.raw")) <= 1);
    CHECK(max_difference(gray.pixels, tf_gray(rgb.pixels)) <= 6);
    const Image rgba = f.decode(name + ".jpg", ColorMode::kRgba);
    CHECK(channel(rgba.pixels, 4, 3) == std::vector<uint8_t>(24 * 40, 255));
  }
  const Image gray = f.decode("gray.jpg", ColorMode::kGrayscale);
  CHECK(max_difference(gray.pixels, f.raw("gray_jpg.raw")) <= 1);
  const Image rgb = f.decode("gray.jpg", ColorMode::kRgb);
  for (int c = 0; c < 3; ++c) CHECK(channel(rgb.pixels, 3, c) == gray.pixels);
}

TEST_CASE("the format comes from the magic bytes, not the name", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  Fixtures f;
  const std::vector<uint8_t> jpeg = f.raw("photo.jpg");
  const Image image = decode_image_bytes(jpeg.data(), jpeg.size(), "looks.png", ColorMode::kRgb);
  CHECK(image.pixels == f.decode("photo.jpg", ColorMode::kRgb).pixels);
  CHECK_THAT(config_error([&] { f.decode("text.png", ColorMode::kRgb); }),
             Contains(f.path("text.png")) && Contains("not a PNG or JPEG file"));
  CHECK_THAT(config_error([&] { decode_image_bytes(nullptr, 0, "empty.jpg", ColorMode::kRgb); }),
             Contains("empty.jpg") && Contains("empty"));
}

TEST_CASE("damaged and hostile files are ConfigErrors naming the file", "[images]") {
  if (!dtrain::testing::have_pil()) return;
  Fixtures f;
  auto error = [&](const std::string& name) {
    const std::string message = config_error([&] { f.decode(name, ColorMode::kRgb); });
    CHECK_THAT(message, Contains(f.path(name)));
    return message;
  };
  CHECK_THAT(error("truncated.png"), Contains("bad PNG") && Contains("truncated"));
  CHECK_THAT(error("truncated.jpg"), Contains("bad JPEG") && Contains("Premature end"));
  CHECK_THAT(error("bad_precision.jpg"), Contains("bad JPEG") && Contains("precision"));
  CHECK_THAT(error("garbage.jpg"), Contains("bad JPEG"));
  // libjpeg warns and fills the rest with flat blocks; we refuse (PIL would decode them).
  CHECK_THAT(error("cut_scan.jpg"), Contains("bad JPEG") && Contains("premature end of data"));
  CHECK_THAT(config_error([&] { f.decode("flat.jpg", ColorMode::kGrayscale); }),
             Contains(f.path("flat.jpg")) && Contains("premature end of data"));
  // Refused from the header, before allocating 30 GB (or 10.8 GB for the JPEG).
  CHECK_THAT(error("huge.png"), Contains("100000x100000x3") && Contains("268435456-byte limit"));
  CHECK_THAT(error("huge.jpg"), Contains("60000x60000x3") && Contains("limit"));
  CHECK_THAT(error("no-such-file.png"), Contains("cannot open"));
  CHECK_THAT(config_error([&] { decode_image_file(f.dir.path(), ColorMode::kRgb); }),
             Contains("not a regular file"));
}

// tf.image.resize(bilinear, antialias=False) computed straight from its definition, in double.
std::vector<double> reference_resize(const Image& in, int out_h, int out_w) {
  auto axis = [](int i, int in_size, int out_size, int* lo, int* hi, double* lerp) {
    const double src = (i + 0.5) * in_size / out_size - 0.5;
    *lo = std::max(0, static_cast<int>(std::floor(src)));
    *hi = std::min(in_size - 1, static_cast<int>(std::ceil(src)));
    *lerp = src - std::floor(src);
  };
  std::vector<double> out;
  for (int y = 0; y < out_h; ++y) {
    int y0, y1, x0, x1;
    double dy, dx;
    axis(y, in.height, out_h, &y0, &y1, &dy);
    for (int x = 0; x < out_w; ++x) {
      axis(x, in.width, out_w, &x0, &x1, &dx);
      for (int c = 0; c < in.channels; ++c) {
        auto at = [&](int yy, int xx) {
          return static_cast<double>(
              in.pixels[(static_cast<size_t>(yy) * in.width + xx) * in.channels + c]);
        };
        const double top = at(y0, x0) * (1 - dx) + at(y0, x1) * dx;
        const double bottom = at(y1, x0) * (1 - dx) + at(y1, x1) * dx;
        out.push_back(top * (1 - dy) + bottom * dy);
      }
    }
  }
  return out;
}

TEST_CASE("bilinear resize with half-pixel centers, as tf.image.resize", "[images]") {
  // Worked by hand: one row [0, 100] to 4 wide samples at -0.25, 0.25, 0.75, 1.25.
  const Image row{1, 2, 1, {0, 100}};
  CHECK(resize_bilinear(row, {1, 4}).pixels == std::vector<uint8_t>{0, 25, 75, 100});
  // Halving averages each 2x2 block (samples at 0.5 and 2.5); 0.5 rounds away from zero.
  const Image square{4, 4, 1, {0, 10, 20, 30, 10, 20, 30, 40, 50, 50, 0, 0, 50, 50, 0, 2}};
  CHECK(resize_bilinear(square, {2, 2}).pixels == std::vector<uint8_t>{10, 30, 50, 1});
  CHECK(resize_bilinear(square, {4, 4}).pixels == square.pixels);
  CHECK_THAT(config_error([&] { resize_bilinear(square, {0, 3}); }), Contains("not positive"));

  if (!dtrain::testing::have_pil()) return;
  Fixtures f;
  const Image rgb = f.decode("rgb.png", ColorMode::kRgb);  // 5 x 7
  for (const ImageSize size :
       {ImageSize{12, 3}, ImageSize{3, 11}, ImageSize{2, 2}, ImageSize{5, 16}, ImageSize{1, 1}}) {
    INFO(size.height << "x" << size.width);
    const Image resized = resize_bilinear(rgb, size);
    REQUIRE(resized.pixels.size() == static_cast<size_t>(size.height * size.width * 3));
    const std::vector<double> expected = reference_resize(rgb, size.height, size.width);
    double worst = 0;
    for (size_t i = 0; i < expected.size(); ++i)
      worst = std::max(worst, std::abs(resized.pixels[i] - expected[i]));
    CHECK(worst <= 0.5 + 1e-3);  // rounding only, plus float error
  }
  const Image via_file = decode_image_file(f.path("rgb.png"), ColorMode::kRgb, ImageSize{3, 11});
  CHECK(via_file.pixels == resize_bilinear(rgb, {3, 11}).pixels);
}
