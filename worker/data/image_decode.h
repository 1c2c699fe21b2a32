// Decodes one PNG or JPEG image (recognised by its magic bytes, not its name) into 8-bit pixels,
// height x width x channels, in the color mode Keras's image_dataset_from_directory asks for,
// then optionally resizes it as tf.image.resize does (bilinear, half-pixel centers, no
// antialias). No other formats (BMP, GIF, WebP), no animation, no EXIF orientation, no writing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::data {

/// Keras's color_mode; the value is the channel count.
enum class ColorMode { kGrayscale = 1, kRgb = 3, kRgba = 4 };

inline int channel_count(ColorMode mode) {
  return static_cast<int>(mode);
}
/// "grayscale", "rgb" or "rgba" (Keras's names); anything else is a common::ConfigError.
ColorMode parse_color_mode(const std::string& name);

struct ImageSize {
  int height = 0;
  int width = 0;
};

/// Pixels of one image, row-major, channels interleaved (HWC).
struct Image {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  ///< exactly height * width * channels bytes
};

/// Largest decoded image, in bytes (width * height * channels, checked against the header before
/// anything is allocated): 256 MiB holds an 8192 x 8192 RGBA image, far above what a training
/// set uses, while a hostile header (PNG allows 2^31 per side) cannot make each decoding thread
/// ask for gigabytes. A JPEG counts its components too, and libjpeg's work memory is capped at
/// twice the limit (a progressive JPEG holds 2 bytes of coefficients per sample).
inline constexpr uint64_t kMaxImageBytes = uint64_t{1} << 28;
/// Largest image file read (a stored, uncompressed PNG is a little larger than its pixels).
inline constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 29;

/// Decodes bytes (a whole PNG or JPEG file; name is only used in messages) into mode:
/// - PNG: palette expanded to RGB (with tRNS as alpha), gray below 8 bits expanded, 16-bit samples
///   cut to their high byte (libpng's png_set_strip_16, as TF's uint8 decode does), interlacing
///   undone. JPEG: libjpeg-turbo, accurate integer IDCT (JDCT_ISLOW, as PIL; TF's default is the
///   faster JDCT_IFAST, which differs by a few levels), fancy upsampling. CMYK JPEGs are refused.
/// - grayscale from color: round(0.2989 R + 0.5870 G + 0.1140 B), tf.image.rgb_to_grayscale's
///   weights, for PNG; a JPEG is decoded straight to its luma plane (libjpeg's JCS_GRAYSCALE, as
///   TF), which is that formula on its RGB decode up to rounding, except where saturated colors
///   clip in RGB (a few levels). Gray to RGB replicates; alpha is dropped, or added as 255.
/// Errors are common::ConfigError "<name>: <what is wrong>": unsupported format, a header over
/// kMaxImageBytes, truncated or corrupt data (libpng and libjpeg errors, and libjpeg's warnings
/// about truncated or corrupt entropy-coded data, which PIL would decode as flat gray blocks; its
/// other warnings, such as extraneous bytes between markers, are ignored as TF and PIL do). Library
/// errors unwind through setjmp/longjmp inside the .cc and never exit or leak. Thread-safe; holds
/// no global state.
Image decode_image_bytes(const uint8_t* data, size_t size, const std::string& name, ColorMode mode);

/// Reads path (a regular file of at most kMaxImageFileBytes) and decodes it as above, then
/// resizes it to size when given. Errors as above, plus an unreadable file; all name path.
Image decode_image_file(const std::string& path, ColorMode mode,
                        std::optional<ImageSize> size = std::nullopt);

/// The height and width in path's header (PNG's IHDR, JPEG's frame header), read without
/// decoding the pixels: what decode_image_file would yield before any resize. Errors as
/// decode_image_file's for the file and the header; the pixel data is not looked at.
ImageSize read_image_dimensions(const std::string& path);

/// tf.image.resize(method="bilinear", antialias=False) on uint8 pixels: source coordinate
/// (out + 0.5) * in / out - 0.5, neighbours clamped to the edge, interpolated in float as TF's
/// ResizeBilinear kernel, then rounded to the nearest integer (halves away from zero) where
/// Keras would keep the float. Size must be positive and the result within kMaxImageBytes
/// (else common::ConfigError); an image already of that size is returned unchanged.
Image resize_bilinear(const Image& image, ImageSize size);

}  // namespace dtrain::data
