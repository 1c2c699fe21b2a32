// See image_decode.h. libpng and libjpeg are used here and nowhere else. Each library call sits in
// a small phase function that does setjmp first and creates no C++ object, so a library error
// longjmps over C frames only; the phase returns false and ordinary C++ code throws the message.
// The structs are owned by RAII readers whose destructors free them on every path.
#include "worker/data/image_decode.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs FILE and size_t declared first.
// clang-format off
#include <stdio.h>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include "common/errors.h"
#include "common/unique_fd.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw ConfigError(fmt::format("{}: {}", name, what));
}

// Refuses a header whose pixels (in the larger of the decoded and the requested channel
// counts) would exceed kMaxImageBytes, before anything is allocated.
void check_dimensions(const std::string& name, uint64_t width, uint64_t height, int channels) {
  if (width == 0 || height == 0) fail(name, fmt::format("image is {}x{}: empty", width, height));
  const uint64_t bytes = width * height * static_cast<uint64_t>(channels);
  if (bytes > kMaxImageBytes) {
    fail(name, fmt::format("image of {}x{}x{} is {} bytes, more than the {}-byte limit", height,
                           width, channels, bytes, kMaxImageBytes));
  }
}

uint8_t gray_of(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>(std::lround(0.2989 * r + 0.5870 * g + 0.1140 * b));
}

// 8-bit pixels with from channels (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) into to (1, 3 or 4).
std::vector<uint8_t> convert_channels(const std::vector<uint8_t>& src, int from, int to) {
  if (from == to) return src;
  const size_t count = src.size() / static_cast<size_t>(from);
  std::vector<uint8_t> out(count * static_cast<size_t>(to));
  const bool from_color = from >= 3;
  const bool from_alpha = from == 2 || from == 4;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* s = &src[i * static_cast<size_t>(from)];
    uint8_t* d = &out[i * static_cast<size_t>(to)];
    if (to == 1) {
      d[0] = from_color ? gray_of(s[0], s[1], s[2]) : s[0];
      continue;
    }
    d[0] = s[0];
    d[1] = from_color ? s[1] : s[0];
    d[2] = from_color ? s[2] : s[0];
    if (to == 4) d[3] = from_alpha ? s[from - 1] : 255;
  }
  return out;
}

// ---- PNG ------------------------------------------------------------------------------------

struct PngInput {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t position = 0;
  char message[256] = {};
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* input = static_cast<PngInput*>(png_get_error_ptr(png));
  std::snprintf(input->message, sizeof input->message, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

void read_png_bytes(png_structp png, png_bytep out, size_t n) {
  auto* input = static_cast<PngInput*>(png_get_io_ptr(png));
  if (input->size - input->position < n) png_error(png, "truncated: the file ends too soon");
  std::memcpy(out, input->data + input->position, n);
  input->position += n;
}

class PngReader {
 public:
  explicit PngReader(PngInput* input) {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, input, on_png_error, on_png_warning);
    if (png_ != nullptr) info_ = png_create_info_struct(png_);
    if (png_ == nullptr || info_ == nullptr) throw std::bad_alloc();
    png_set_read_fn(png_, input, read_png_bytes);
  }
  ~PngReader() { png_destroy_read_struct(&png_, &info_, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
  png_structp png() const { return png_; }
  png_infop info() const { return info_; }

 private:
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

bool read_png_header(const PngReader& reader) {
  if (setjmp(png_jmpbuf(reader.png()))) return false;
  png_read_info(reader.png(), reader.info());
  return true;
}

// Channels after png_set_expand: palette to RGB, tRNS to alpha, gray below 8 bits to 8.
int expanded_png_channels(const PngReader& reader) {
  const int type = png_get_color_type(reader.png(), reader.info());
  const bool color = (type & PNG_COLOR_MASK_COLOR) != 0;  // palette images have it too
  const bool alpha = (type & PNG_COLOR_MASK_ALPHA) != 0 ||
                     png_get_valid(reader.png(), reader.info(), PNG_INFO_tRNS) != 0;
  return (color ? 3 : 1) + (alpha ? 1 : 0);
}

// Sets the transforms to 8-bit gray, gray+alpha, RGB or RGBA; allocates one row.
bool set_png_transforms(const PngReader& reader) {
  if (setjmp(png_jmpbuf(reader.png()))) return false;
  png_set_expand(reader.png());
  png_set_strip_16(reader.png());
  png_set_interlace_handling(reader.png());
  png_read_update_info(reader.png(), reader.info());
  return true;
}

bool read_png_rows(const PngReader& reader, png_bytep* rows) {
  if (setjmp(png_jmpbuf(reader.png()))) return false;
  png_read_image(reader.png(), rows);
  return true;
}

Image decode_png(const uint8_t* data, size_t size, const std::string& name, ColorMode mode) {
  PngInput input;
  input.data = data;
  input.size = size;
  PngReader reader(&input);
  if (!read_png_header(reader)) fail(name, fmt::format("bad PNG: {}", input.message));
  const uint32_t width = png_get_image_width(reader.png(), reader.info());
  const uint32_t height = png_get_image_height(reader.png(), reader.info());
  const int channels = expanded_png_channels(reader);
  check_dimensions(name, width, height, std::max(channels, channel_count(mode)));
  if (!set_png_transforms(reader)) fail(name, fmt::format("bad PNG: {}", input.message));
  DT_ENFORCE_EQ(int{png_get_channels(reader.png(), reader.info())}, channels, "{}", name);
  const size_t row_bytes = static_cast<size_t>(width) * static_cast<size_t>(channels);
  DT_ENFORCE_EQ(png_get_rowbytes(reader.png(), reader.info()), row_bytes, "{}", name);
  std::vector<uint8_t> pixels(row_bytes * height);
  std::vector<png_bytep> rows(height);
  for (uint32_t y = 0; y < height; ++y) rows[y] = pixels.data() + y * row_bytes;
  if (!read_png_rows(reader, rows.data())) fail(name, fmt::format("bad PNG: {}", input.message));
  Image image{static_cast<int>(height), static_cast<int>(width), channel_count(mode), {}};
  image.pixels = convert_channels(pixels, channels, image.channels);
  return image;
}

// ---- JPEG -----------------------------------------------------------------------------------

// A progressive JPEG of a few KB can hold thousands of scans, each a pass over the whole image.
constexpr int kMaxJpegScans = 1000;

struct JpegErrors {
  jpeg_error_mgr manager;  // first: libjpeg sees a jpeg_error_mgr*
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_jpeg_error(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Truncated or corrupt entropy-coded data is an error: libjpeg would fill the rest of the image
// with flat blocks, so a few bytes could make it decode (and us train on) a huge gray image.
// Other warnings (extraneous bytes between markers, unknown JFIF versions, ...) and traces are
// ignored, as TF and PIL do.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level != -1) return;
  switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
      on_jpeg_error(cinfo);
    default:
      return;
  }
}

void on_jpeg_progress(j_common_ptr cinfo) {
  auto* decompress = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (decompress->input_scan_number > kMaxJpegScans) {
    auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
    std::snprintf(errors->message, sizeof errors->message, "more than %d scans", kMaxJpegScans);
    std::longjmp(errors->jump, 1);
  }
}

class JpegReader {
 public:
  JpegReader() {
    cinfo_.err = jpeg_std_error(&errors_.manager);
    errors_.manager.error_exit = on_jpeg_error;
    errors_.manager.emit_message = on_jpeg_message;
    progress_.progress_monitor = on_jpeg_progress;
  }
  ~JpegReader() { jpeg_destroy_decompress(&cinfo_); }  // safe on a struct never created
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;
  j_decompress_ptr cinfo() { return &cinfo_; }
  JpegErrors& errors() { return errors_; }
  jpeg_progress_mgr* progress() { return &progress_; }

 private:
  jpeg_decompress_struct cinfo_{};
  JpegErrors errors_{};
  jpeg_progress_mgr progress_{};
};

bool read_jpeg_header(JpegReader& reader, const uint8_t* data, size_t size) {
  if (setjmp(reader.errors().jump)) return false;
  jpeg_create_decompress(reader.cinfo());
  // A progressive JPEG keeps every DCT coefficient, 2 bytes a sample: twice the pixels.
  reader.cinfo()->mem->max_memory_to_use = static_cast<long>(2 * kMaxImageBytes);
  reader.cinfo()->progress = reader.progress();
  jpeg_mem_src(reader.cinfo(), data, static_cast<unsigned long>(size));
  jpeg_read_header(reader.cinfo(), TRUE);
  return true;
}

// 0: decoded; 1: a library error (message in errors()); 2: not the promised shape.
int read_jpeg_rows(JpegReader& reader, uint8_t* out, uint32_t width, int channels) {
  if (setjmp(reader.errors().jump)) return 1;
  j_decompress_ptr cinfo = reader.cinfo();
  jpeg_start_decompress(cinfo);
  if (cinfo->output_width != width || cinfo->output_components != channels) return 2;
  const size_t row_bytes = static_cast<size_t>(width) * static_cast<size_t>(channels);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + cinfo->output_scanline * row_bytes;
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {  // only a suspending source does this
      std::snprintf(reader.errors().message, sizeof reader.errors().message, "no row decoded");
      return 1;
    }
  }
  return 0;  // no jpeg_finish_decompress: bytes after the last row are not needed
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name, ColorMode mode) {
  JpegReader reader;
  if (!read_jpeg_header(reader, data, size))
    fail(name, fmt::format("bad JPEG: {}", reader.errors().message));
  j_decompress_ptr cinfo = reader.cinfo();
  if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK)
    fail(name, "unsupported JPEG: CMYK colors (convert it to RGB)");
  const bool gray = mode == ColorMode::kGrayscale;
  cinfo->out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  cinfo->dct_method = JDCT_ISLOW;
  const int channels = gray ? 1 : 3;
  check_dimensions(name, cinfo->image_width, cinfo->image_height,
                   std::max({cinfo->num_components, channels, channel_count(mode)}));
  const uint32_t width = cinfo->image_width;
  const uint32_t height = cinfo->image_height;
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * static_cast<size_t>(channels));
  const int result = read_jpeg_rows(reader, pixels.data(), width, channels);
  if (result == 1) fail(name, fmt::format("bad JPEG: {}", reader.errors().message));
  DT_ENFORCE(result == 0, "{}: libjpeg decoded another shape than its header's", name);
  Image image{static_cast<int>(height), static_cast<int>(width), channel_count(mode), {}};
  image.pixels = convert_channels(pixels, channels, image.channels);
  return image;
}

constexpr uint8_t kPngMagic[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr uint8_t kJpegMagic[] = {0xff, 0xd8, 0xff};

[[noreturn]] void fail_format(const uint8_t* data, size_t size, const std::string& name) {
  std::string start;
  for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) start += fmt::format(" {:02x}", data[i]);
  fail(name, fmt::format("not a PNG or JPEG file (it starts with{})",
                         size == 0 ? " nothing: it is empty" : start));
}

std::vector<uint8_t> read_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer would wait for one, forever.
  common::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) fail(path, fmt::format("cannot open ({})", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    fail(path, fmt::format("cannot stat ({})", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > kMaxImageFileBytes)
    fail(path, fmt::format("{} bytes, more than the {}-byte limit", size, kMaxImageFileBytes));
  std::vector<uint8_t> bytes(size);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, fmt::format("cannot read ({})", std::strerror(errno)));
    if (n == 0) fail(path, "file shrank while being read");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

// Where output index i samples the input: TF's HalfPixelScaler and compute_interpolation_weights.
struct Sample {
  int lower = 0;
  int upper = 0;
  float lerp = 0;
};

std::vector<Sample> samples(int in, int out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  std::vector<Sample> result(static_cast<size_t>(out));
  for (int i = 0; i < out; ++i) {
    const float source = (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    const float floor = std::floor(source);
    result[i].lower = std::max(static_cast<int>(floor), 0);
    result[i].upper = std::min(static_cast<int>(std::ceil(source)), in - 1);
    result[i].lerp = source - floor;
  }
  return result;
}

}  // namespace

ColorMode parse_color_mode(const std::string& name) {
  if (name == "grayscale") return ColorMode::kGrayscale;
  if (name == "rgb") return ColorMode::kRgb;
  if (name == "rgba") return ColorMode::kRgba;
  throw ConfigError(
      fmt::format("color_mode \"{}\" is not one of \"grayscale\", \"rgb\", \"rgba\"", name));
}

Image decode_image_bytes(const uint8_t* data, size_t size, const std::string& name,
                         ColorMode mode) {
  if (size >= sizeof kPngMagic && std::memcmp(data, kPngMagic, sizeof kPngMagic) == 0)
    return decode_png(data, size, name, mode);
  if (size >= sizeof kJpegMagic && std::memcmp(data, kJpegMagic, sizeof kJpegMagic) == 0)
    return decode_jpeg(data, size, name, mode);
  fail_format(data, size, name);
}

Image decode_image_file(const std::string& path, ColorMode mode, std::optional<ImageSize> size) {
  const std::vector<uint8_t> bytes = read_file(path);
  Image image = decode_image_bytes(bytes.data(), bytes.size(), path, mode);
  if (!size) return image;
  try {
    return resize_bilinear(image, *size);
  } catch (const ConfigError& error) {
    fail(path, error.what());
  }
}

ImageSize read_image_dimensions(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path);
  if (bytes.size() >= sizeof kPngMagic &&
      std::memcmp(bytes.data(), kPngMagic, sizeof kPngMagic) == 0) {
    PngInput input;
    input.data = bytes.data();
    input.size = bytes.size();
    PngReader reader(&input);
    if (!read_png_header(reader)) fail(path, fmt::format("bad PNG: {}", input.message));
    return {static_cast<int>(png_get_image_height(reader.png(), reader.info())),
            static_cast<int>(png_get_image_width(reader.png(), reader.info()))};
  }
  if (bytes.size() >= sizeof kJpegMagic &&
      std::memcmp(bytes.data(), kJpegMagic, sizeof kJpegMagic) == 0) {
    JpegReader reader;
    if (!read_jpeg_header(reader, bytes.data(), bytes.size()))
      fail(path, fmt::format("bad JPEG: {}", reader.errors().message));
    return {static_cast<int>(reader.cinfo()->image_height),
            static_cast<int>(reader.cinfo()->image_width)};
  }
  fail_format(bytes.data(), bytes.size(), path);
}

Image resize_bilinear(const Image& image, ImageSize size) {
  if (size.height <= 0 || size.width <= 0)
    throw ConfigError(fmt::format("image_size {}x{} is not positive", size.height, size.width));
  const uint64_t bytes = static_cast<uint64_t>(size.height) * static_cast<uint64_t>(size.width) *
                         static_cast<uint64_t>(image.channels);
  if (bytes > kMaxImageBytes) {
    throw ConfigError(fmt::format("image_size {}x{} is {} bytes, more than the {}-byte limit",
                                  size.height, size.width, bytes, kMaxImageBytes));
  }
  if (size.height == image.height && size.width == image.width) return image;
  const std::vector<Sample> ys = samples(image.height, size.height);
  const std::vector<Sample> xs = samples(image.width, size.width);
  const size_t c = static_cast<size_t>(image.channels);
  const size_t in_row = static_cast<size_t>(image.width) * c;
  Image out{size.height, size.width, image.channels, std::vector<uint8_t>(bytes)};
  uint8_t* d = out.pixels.data();
  for (const Sample& y : ys) {
    const uint8_t* top = &image.pixels[static_cast<size_t>(y.lower) * in_row];
    const uint8_t* bottom = &image.pixels[static_cast<size_t>(y.upper) * in_row];
    for (const Sample& x : xs) {
      const size_t left = static_cast<size_t>(x.lower) * c;
      const size_t right = static_cast<size_t>(x.upper) * c;
      for (size_t k = 0; k < c; ++k) {
        const float tl = top[left + k], tr = top[right + k];
        const float bl = bottom[left + k], br = bottom[right + k];
        const float t = tl + (tr - tl) * x.lerp;
        const float b = bl + (br - bl) * x.lerp;
        const float value = t + (b - t) * y.lerp;
        *d++ = static_cast<uint8_t>(std::clamp(std::lround(value), 0L, 255L));
      }
    }
  }
  return out;
}

}  // namespace dtrain::data
