// PNG and JPEG bytes (worker/data/image_decode.h) decoded in each color mode straight from
// memory: an accepted image holds exactly height * width * channels bytes, within the size
// limit. Refusals must be ConfigErrors; a libpng or libjpeg error that escapes its longjmp path,
// leaks or overreads is a finding (ASan). Resizing is not fuzzed here (no bytes reach it).
#include <cstdint>

#include "test/fuzz/fuzz_support.h"
#include "worker/data/image_decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  for (data::ColorMode mode :
       {data::ColorMode::kGrayscale, data::ColorMode::kRgb, data::ColorMode::kRgba}) {
    data::Image image;
    if (!fuzz::accepts([&] { image = data::decode_image_bytes(data, size, "fuzz", mode); }))
      continue;
    const uint64_t expected = static_cast<uint64_t>(image.height) *
                              static_cast<uint64_t>(image.width) *
                              static_cast<uint64_t>(image.channels);
    fuzz::require(image.height > 0 && image.width > 0, "an accepted image is not empty");
    fuzz::require(image.channels == data::channel_count(mode), "the channels asked for");
    fuzz::require(expected == image.pixels.size(), "height * width * channels bytes");
    fuzz::require(expected <= data::kMaxImageBytes, "within kMaxImageBytes");
  }
  return 0;
}
