// .npy and .npz files made by hand, byte by byte: every header version, then damage of every
// kind (truncated headers, shapes promising more than the file holds, bad dicts, unknown dtypes,
// zip directories that lie, deflate streams that yield other than promised), each a ConfigError
// naming the file. Files written by NumPy itself are test_npy.cc's.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "test/support/config_error.h"
#include "test/support/temp_dir.h"
#include "test/support/zip_builder.h"
#include "worker/data/npy_file.h"
#include "worker/data/npz_file.h"

using namespace dtrain::data;
using Catch::Contains;
using dtrain::common::ConfigError;
using dtrain::testing::TempDir;

using dtrain::testing::config_error;
using dtrain::testing::put;
using dtrain::testing::zip;
using Member = dtrain::testing::ZipEntry;

namespace {

// An .npy file: magic, version, header length, dict padded with spaces to 64 bytes and '\n'.
std::string npy(const std::string& dict, const std::string& data, int major = 1) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  while ((8 + length_bytes + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  put(out, header.size(), static_cast<int>(length_bytes));
  return out + header + data;
}

std::string dict(const std::string& descr, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
}

const std::string kGood = npy(dict("|u1", "(2, 3)"), "abcdef");

std::string write(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace

TEST_CASE("read_npy reads header versions 1.0, 2.0 and 3.0", "[npy]") {
  TempDir dir;
  for (int major : {1, 2, 3}) {
    const std::string path = write(dir, "v" + std::to_string(major),
                                   npy(dict("<i2", "(3,)"), std::string("\1\0\2\0\3\1", 6), major));
    NpyArray array = read_npy(path);
    CHECK((array.dtype == NpyDtype::kInt16 && array.descr == "<i2" && array.count == 3));
    CHECK(array.shape == std::vector<int64_t>{3});
    REQUIRE(array.bytes == 6);
    CHECK(std::string(reinterpret_cast<const char*>(array.data.get()), 6) ==
          std::string("\1\0\2\0\3\1", 6));
  }
  NpyArray scalar = read_npy(write(dir, "scalar", npy(dict("<f4", "()"), "abcd")));
  CHECK((scalar.shape.empty() && scalar.count == 1 && scalar.bytes == 4));
  NpyArray empty = read_npy(write(dir, "empty", npy(dict("<u4", "(0, 5)"), "")));
  CHECK((empty.count == 0 && empty.bytes == 0));
}

TEST_CASE("data files rewritten after they were read change nothing, and raise no signal",
          "[npy]") {
  // Issue 43, item 6: arrays read from a mapping. np.savez to the same path truncates first, and
  // every worker died of SIGBUS; a same-size rewrite changed the data the survivors trained on.
  TempDir dir;
  const std::string old_data(5000, 'a'), new_data(5000, 'b');
  const std::string npy_path = write(dir, "x.npy", npy(dict("|u1", "(5000,)"), old_data));
  const std::string npz_path =
      write(dir, "x.npz", zip({{"x.npy", npy(dict("|u1", "(5000,)"), old_data), false, nullptr}}));
  const NpyArray from_npy = read_npy(npy_path);
  const NpyArray from_npz = NpzFile(npz_path).read("x");
  auto holds = [](const NpyArray& array, const std::string& bytes) {
    return array.bytes == bytes.size() &&
           std::memcmp(array.data.get(), bytes.data(), bytes.size()) == 0;
  };
  // Rewritten with the same size and other bytes.
  write(dir, "x.npy", npy(dict("|u1", "(5000,)"), new_data));
  write(dir, "x.npz", zip({{"x.npy", npy(dict("|u1", "(5000,)"), new_data), false, nullptr}}));
  CHECK(holds(from_npy, old_data));
  CHECK(holds(from_npz, old_data));
  // Truncated, as np.savez leaves a file before it writes: read in a child, where a SIGBUS
  // would end only the child.
  write(dir, "x.npy", "");
  write(dir, "x.npz", "");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(holds(from_npy, old_data) && holds(from_npz, old_data) ? 0 : 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("the child " << (WIFSIGNALED(status) ? "died of signal " + std::to_string(WTERMSIG(status))
                                            : "exited " + std::to_string(WEXITSTATUS(status))));
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  // Read again now, the file is what it is now: empty, and refused.
  CHECK_THAT(config_error([&] { read_npy(npy_path); }), Contains("truncated .npy header"));
}

TEST_CASE("damaged .npy files are refused, naming the file and what is wrong", "[npy]") {
  TempDir dir;
  auto error = [&](const std::string& bytes) {
    const std::string path = write(dir, "bad.npy", bytes);
    std::string message = config_error([&] { read_npy(path); });
    CHECK_THAT(message, Contains(path + ": "));
    return message;
  };
  CHECK_THAT(error(""), Contains("truncated .npy header"));
  CHECK_THAT(error(kGood.substr(0, 9)), Contains("truncated .npy header"));
  CHECK_THAT(error(kGood.substr(0, 40)),
             Contains("truncated .npy header: needs 128 bytes, has 40"));
  CHECK_THAT(error("PK\3\4" + kGood), Contains("not an .npy file"));
  std::string v9 = kGood;
  v9[6] = 9;
  CHECK_THAT(error(v9), Contains(".npy format version 9.0 is not supported"));
  CHECK_THAT(error(kGood.substr(0, kGood.size() - 1)),
             Contains("truncated: shape (2, 3) of '|u1' needs 6 bytes of data, has 5"));
  CHECK_THAT(error(kGood + "x"), Contains("trailing bytes"));
  // 10^15 elements: refused by arithmetic, never allocated.
  CHECK_THAT(
      error(npy(dict("<u8", "(1000000000, 1000000)"), "abcdefgh")),
      Contains("shape (1000000000, 1000000) of '<u8' needs 8000000000000000 bytes of data, has 8"));
  CHECK_THAT(error(npy(dict("<u1", "(99999999999999999999,)"), "")),
             Contains("a dimension of the shape is too large"));
  CHECK_THAT(error(npy(dict("<c8", "(1,)"), "12345678")), Contains("dtype '<c8' is not supported"));
  CHECK_THAT(error(npy(dict("|O", "(1,)"), "12345678")), Contains("dtype '|O' is not supported"));
  CHECK_THAT(error(npy("{'descr': [('a', '<u1')], 'fortran_order': False, 'shape': (1,), }", "a")),
             Contains("structured dtypes are not supported"));
  CHECK_THAT(error(npy("{'descr': '<u1', 'fortran_order': False, 'shape': (1,), 'x': 1}", "a")),
             Contains("bad .npy header: unknown key 'x'"));
  CHECK_THAT(error(npy("{'descr': '<u1', 'shape': (1,)}", "a")),
             Contains("needs 'descr', 'fortran_order' and 'shape'"));
  CHECK_THAT(error(npy("{'descr': '<u1, 'fortran_order': False, 'shape': (1,)}", "a")),
             Contains("bad .npy header"));
  CHECK_THAT(error(npy("{'descr': '<u1', 'fortran_order': Maybe, 'shape': (1,)}", "a")),
             Contains("fortran_order must be True or False"));
  CHECK_THAT(error(npy("{'descr': '<u1', 'fortran_order': False, 'shape': (1,)} x", "a")),
             Contains("unexpected text after the header dict"));
  CHECK_THAT(error(npy("{'descr': '<u1', 'fortran_order': False, 'shape': (-1,)}", "a")),
             Contains("expected a dimension"));
  CHECK_THAT(config_error([&] { read_npy(dir.path() + "/missing.npy"); }),
             Contains(dir.path() + "/missing.npy: cannot open"));
  CHECK_THAT(config_error([&] { read_npy(dir.path()); }),
             Contains("not a regular file (a folder)"));
}

TEST_CASE("hand-made .npz archives: stored and deflated members read back, zip64 or not", "[npy]") {
  TempDir dir;
  const bool zip64 = GENERATE(false, true);
  const std::string path = write(
      dir, "ok.npz",
      zip({{"a.npy", kGood, false, nullptr}, {"b.npy", kGood, true, nullptr}}, nullptr, zip64));
  NpzFile archive(path);
  CHECK(archive.keys() == std::vector<std::string>{"a", "b"});
  for (const std::string key : {"a", "b"}) {
    NpyArray array = archive.read(key);
    CHECK(array.shape == std::vector<int64_t>{2, 3});
    CHECK(std::string(reinterpret_cast<const char*>(array.data.get()), array.bytes) == "abcdef");
  }
}

TEST_CASE("damaged .npz archives are refused, naming the file, the key and what is wrong",
          "[npy]") {
  TempDir dir;
  auto error = [&](const std::string& bytes, const std::string& key = "a") {
    const std::string path = write(dir, "bad.npz", bytes);
    std::string message = config_error([&] { NpzFile(path).read(key); });
    CHECK_THAT(message, Contains(path + ": "));
    return message;
  };
  auto lie = [](size_t at, uint64_t value, int bytes) {
    return [=](std::string& s) {
      std::string v;
      put(v, value, bytes);
      s.replace(at, static_cast<size_t>(bytes), v);
    };
  };
  CHECK_THAT(error("not a zip at all, just some text"), Contains("no end of central directory"));
  CHECK_THAT(error(kGood), Contains("no end of central directory"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, nullptr}}, lie(16, 1000000, 4))),
             Contains("the central directory"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, nullptr}}, lie(10, 60000, 2))),
             Contains("entries cannot fit"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, nullptr}}, lie(64, 7, 8), true)),  // locator
             Contains("bad zip64 end of central directory locator"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, nullptr}}, lie(40, 3, 8), true)),  // cd size
             Contains("the central directory"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, [](std::string& e) { e.resize(e.size() - 8); }}},
                       nullptr, true)),
             Contains("bad zip archive"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, lie(42, 7, 4)}})), Contains("a: bad zip archive"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, lie(20, 1u << 30, 4)}})),
             Contains("a: bad zip archive"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, lie(16, 0x12345678, 4)}})),
             Contains("a: CRC-32 mismatch"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, lie(10, 12, 2)}})),
             Contains("a: compression method 12 is not supported"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, lie(8, 1, 2)}})),
             Contains("a: the member is encrypted"));
  CHECK_THAT(error(zip({{"a.npy", kGood, false, nullptr}}), "b"),
             Contains("bad.npz: b: no such array in the archive (it has: a)"));
  CHECK_THAT(error(zip({{"a.npy", "PK" + kGood, false, nullptr}})),
             Contains("a: not an .npy file"));
  // A deflated member whose directory says it is smaller, or larger, than what it inflates to.
  CHECK_THAT(error(zip({{"a.npy", kGood, true, lie(24, kGood.size() - 1, 4)}})),
             Contains("a: truncated: shape (2, 3)"));
  CHECK_THAT(error(zip({{"a.npy", kGood, true, lie(24, kGood.size() + 1, 4)}})),
             Contains("a: trailing bytes"));
  // A deflated member that yields more than its header promises (a bomb) stops at the promise.
  const std::string bomb = kGood + std::string(1 << 20, 'x');
  CHECK_THAT(error(zip({{"a.npy", bomb, true, lie(24, kGood.size(), 4)}})),
             Contains("a: the deflated member yields more than 6 bytes of data"));
  std::string truncated = zip({{"a.npy", bomb, true, nullptr}});
  truncated.replace(60, 40, std::string(40, '\xff'));
  CHECK_THAT(error(truncated), Contains("a: bad deflate data"));
}

TEST_CASE("read_bytes gives any member's bytes as they are, stored or deflated", "[npy]") {
  TempDir dir;
  const std::string text = R"({"class_name": "Sequential", "config": {}})";
  NpzFile archive(
      write(dir, "model.keras",
            zip({{"config.json", text, false, nullptr}, {"packed.json", text, true, nullptr}})));
  CHECK(archive.read_bytes("config.json") == text);
  CHECK(archive.read_bytes("packed.json") == text);
  CHECK_THAT(config_error([&] { archive.read_bytes("none.json"); }),
             Contains("model.keras: none.json: no such member in the archive"));
  // What read() refuses, read_bytes refuses: a CRC that does not match, a deflated member that
  // yields more than the directory says (it stops there) or less.
  auto sized = [](size_t at, uint64_t value) {
    return [=](std::string& entry) {
      std::string v;
      put(v, value, 4);
      entry.replace(at, 4, v);
    };
  };
  auto error = [&](const Member& member) {
    const std::string path = write(dir, "bad.keras", zip({member}));
    return config_error([&] { NpzFile(path).read_bytes(member.name); });
  };
  CHECK_THAT(error({"config.json", text, false, sized(16, 0x12345678)}),
             Contains("bad.keras: config.json: CRC-32 mismatch"));
  const std::string bomb = text + std::string(1 << 20, ' ');
  CHECK_THAT(error({"config.json", bomb, true, sized(24, text.size())}),
             Contains("config.json: the deflated member yields more than"));
  CHECK_THAT(error({"config.json", text, true, sized(24, text.size() + 1)}),
             Contains("config.json: the deflated member yields 42 bytes, the directory says 43"));
}
