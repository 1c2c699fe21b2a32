// Real PNG and JPEG files for the image tests (test_images.cc), written by Debian's PIL
// (python3-pil, from scripts/setup.sh --tests) run as /usr/bin/python3, each with PIL's own decode
// beside it as raw bytes (<name>.raw) to compare with. 16-bit and hostile PNGs are written byte by
// byte (PIL writes neither). Tests skip with a WARN when PIL is missing (see python.h).
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test/support/python.h"
#include "test/support/subprocess.h"

namespace dtrain::testing {

inline constexpr const char* kImageFixtures = R"PY(
import struct, sys, zlib
from PIL import Image
out = sys.argv[1]
def save(img, name, **kw):
    img.save(f'{out}/{name}', **kw)
def raw(img, name):
    open(f'{out}/{name}.raw', 'wb').write(img.tobytes())
def pattern(mode, w, h):
    img = Image.new(mode, (w, h))
    n = len(mode)
    img.putdata([tuple((x * 37 + y * 91 + c * 53 + x * y * 7) % 256 for c in range(n))
                 if n > 1 else (x * 37 + y * 91 + x * y * 7) % 256
                 for y in range(h) for x in range(w)])
    return img
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
def png(name, w, h, depth, color, rows):
    ihdr = struct.pack('>IIBBBBB', w, h, depth, color, 0, 0, 0)
    idat = zlib.compress(b''.join(b'\0' + r for r in rows))
    open(f'{out}/{name}', 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) +
                                      chunk(b'IDAT', idat) + chunk(b'IEND', b''))
gray = pattern('L', 5, 7); save(gray, 'gray.png'); raw(gray, 'gray')
rgb = pattern('RGB', 7, 5); save(rgb, 'rgb.png'); raw(rgb, 'rgb'); raw(rgb.convert('L'), 'rgb_L')
rgba = pattern('RGBA', 6, 4); save(rgba, 'rgba.png'); raw(rgba, 'rgba')
pal = rgb.convert('P', palette=Image.ADAPTIVE, colors=16)
save(pal, 'pal.png'); raw(pal.convert('RGB'), 'pal_rgb')
save(pal, 'pal_t.png', transparency=3); raw(Image.open(f'{out}/pal_t.png').convert('RGBA'), 'pal_t')
bit1 = pattern('L', 9, 3).convert('1'); save(bit1, 'bit1.png'); raw(bit1.convert('L'), 'bit1_L')
big = [[(x * 4099 + y * 257 + c * 9001) % 65536 for x in range(4) for c in range(3)]
       for y in range(3)]
png('rgb16.png', 4, 3, 16, 2, [struct.pack('>12H', *r) for r in big])
open(f'{out}/rgb16.raw', 'wb').write(bytes(v >> 8 for r in big for v in r))
photo = Image.new('RGB', (40, 24))
photo.putdata([(x * 6, y * 10, (x * y * 3 + (x % 5) * 20) % 256) for y in range(24) for x in range(40)])
for name, kw in (('photo', {}), ('progressive', {'progressive': True})):
    save(photo, name + '.jpg', quality=90, **kw)
    raw(Image.open(f'{out}/{name}.jpg').convert('RGB'), name + '_rgb')
    luma = Image.open(f'{out}/{name}.jpg'); luma.draft('L', luma.size)  # libjpeg's gray output
    raw(luma.convert('L'), name + '_L')
save(photo.convert('L'), 'gray.jpg', quality=90); raw(Image.open(f'{out}/gray.jpg'), 'gray_jpg')
png('huge.png', 100000, 100000, 8, 2, [b'\0' * 300])
jpeg = bytearray(open(f'{out}/photo.jpg', 'rb').read())
sof = jpeg.index(b'\xff\xc0')
wide = bytearray(jpeg); wide[sof + 5:sof + 9] = struct.pack('>HH', 60000, 60000)
open(f'{out}/huge.jpg', 'wb').write(wide)
bad = bytearray(jpeg); bad[sof + 4] = 7  # sample precision 7 bits
open(f'{out}/bad_precision.jpg', 'wb').write(bad)
sos = jpeg.index(b'\xff\xda')  # scan data cut short by an end marker
open(f'{out}/cut_scan.jpg', 'wb').write(jpeg[:sos + 40] + b'\xff\xd9')
flat = bytearray(open(f'{out}/gray.jpg', 'rb').read())  # 16000x16000 from 20 bytes of scan
sof = flat.index(b'\xff\xc0'); flat[sof + 5:sof + 9] = struct.pack('>HH', 16000, 16000)
sos = flat.index(b'\xff\xda')
open(f'{out}/flat.jpg', 'wb').write(flat[:sos + 20] + b'\xff\xd9')
open(f'{out}/garbage.jpg', 'wb').write(jpeg[:4] + b'\0' * 200)
open(f'{out}/truncated.jpg', 'wb').write(jpeg[:len(jpeg) // 2])
whole = open(f'{out}/rgb.png', 'rb').read()
open(f'{out}/truncated.png', 'wb').write(whole[:len(whole) // 2])
open(f'{out}/text.png', 'wb').write(b'hello, not an image')
)PY";

/// True when /usr/bin/python3 has PIL; WARNs otherwise (throws when test beds are required).
inline bool have_pil() {
  if (python_imports("PIL")) return true;
  WARN("skipped: " << kSystemPython << " lacks PIL (apt-get install python3-pil)");
  return false;
}

/// Runs a Python program with arguments; fails the test with its stderr when it fails.
inline void run_python(const std::string& program, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kSystemPython, "-c", program};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult result = run_process(argv);
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
}

inline std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace dtrain::testing
