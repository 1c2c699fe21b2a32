// common::ZipReader on zip archives made byte by byte (test/support/zip_builder.h, zlib for the
// deflated members): members listed and read back, stored and deflated, streamed through
// ZipInflater, and each kind of damage refused with its exact message. Archives written by NumPy
// are test/data's (test_npy.cc, through NpzFile); the npz-specific checks are
// test_npy_damaged.cc's.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/zip_reader.h"
#include "test/support/config_error.h"
#include "test/support/temp_dir.h"
#include "test/support/zip_builder.h"

using namespace dtrain::common;
using dtrain::testing::config_error;
using dtrain::testing::TempDir;
using dtrain::testing::zip;

namespace {

uint32_t crc_of(const std::string& s) {
  return zip_crc32(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string write(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

const std::string kText = R"({"class_name": "Sequential", "config": {"layers": []}})";

}  // namespace

TEST_CASE("zip_crc32 is zip's CRC-32") {
  const std::string check = "123456789";
  CHECK(crc_of(check) == 0xcbf43926u);
  CHECK(zip_crc32(nullptr, 0) == 0u);
}

TEST_CASE("stored and deflated members are listed in order and read back") {
  TempDir dir;
  const std::string big(100000, 'z');  // deflates to far less than it is
  const std::string path =
      write(dir, "model.keras",
            zip({{"config.json", kText}, {"packed.json", kText, true}, {"big.bin", big, true}}));
  ZipReader archive(path);
  CHECK(archive.path() == path);
  REQUIRE(archive.members().size() == 3);
  const ZipMember& stored = archive.members()[0];
  CHECK(stored.name == "config.json");
  CHECK(stored.method == kZipStored);
  CHECK(stored.flags == 0);
  CHECK(stored.crc == crc_of(kText));
  CHECK((stored.compressed == kText.size() && stored.uncompressed == kText.size()));
  const ZipMember& packed = archive.members()[1];
  CHECK(packed.name == "packed.json");
  CHECK(packed.method == kZipDeflated);
  CHECK(packed.uncompressed == kText.size());
  CHECK(archive.members()[2].compressed < big.size() / 100);

  CHECK(archive.find("packed.json") == &packed);
  CHECK(archive.find("packed") == nullptr);  // exact names only
  CHECK(archive.read_bytes("config.json") == kText);
  CHECK(archive.read_bytes("packed.json") == kText);
  CHECK(archive.read_bytes("big.bin") == big);

  // A stored member's bytes stay in the archive's, and share() keeps them alive.
  std::shared_ptr<const uint8_t> kept = archive.share(archive.stored_data(stored, "here"));
  {
    ZipReader copy = archive;  // copies share the bytes too
    archive = ZipReader(write(dir, "other.zip", zip({{"x", "y"}})));
    CHECK(copy.read_bytes("config.json") == kText);
  }
  CHECK(std::string(reinterpret_cast<const char*>(kept.get()), kText.size()) == kText);
}

TEST_CASE("an archive already read is opened from its bytes, not read again") {
  TempDir dir;
  const std::string path = write(dir, "model.keras", zip({{"config.json", kText, true}}));
  auto bytes = std::make_shared<const FileBytes>(path);
  ZipReader archive(bytes);
  CHECK(archive.path() == path);
  CHECK(archive.read_bytes("config.json") == kText);
  // The reader shares the bytes it was given: no second copy of the file.
  CHECK(archive.share(bytes->data()).get() == bytes->data());
  CHECK(bytes.use_count() >= 2);
  const std::string not_zip = write(dir, "config.json", kText);
  CHECK(config_error([&] { ZipReader{std::make_shared<const FileBytes>(not_zip)}; }) ==
        not_zip + ": not a zip archive (no end of central directory record)");
}

TEST_CASE("ZipInflater streams a deflated member in pieces, with its CRC-32") {
  TempDir dir;
  std::string contents;
  for (int i = 0; i < 5000; ++i) contents += std::to_string(i * 7919 % 1000) + ",";
  ZipReader archive(write(dir, "a.zip", zip({{"numbers.csv", contents, true}})));
  const ZipMember& m = archive.members()[0];
  ZipInflater in(archive.member_data(m, "a.zip: numbers.csv"), m.compressed, "a.zip: numbers.csv");
  std::string out;
  uint8_t piece[1000];
  for (size_t got = 0; (got = in.read(piece, sizeof piece)) > 0;) {
    out.append(reinterpret_cast<const char*>(piece), got);
    if (got < sizeof piece) break;  // fewer only at the end
  }
  CHECK(out == contents);
  CHECK(in.at_end());
  CHECK(in.crc() == m.crc);
  ZipInflater moved = std::move(in);
  CHECK(moved.at_end());
  CHECK(moved.crc() == m.crc);
}

TEST_CASE("a CRC mismatch is refused with its exact message, stored or deflated") {
  TempDir dir;
  const bool deflate = GENERATE(false, true);
  const std::string path =
      write(dir, "bad.keras", zip({{"config.json", kText, deflate, nullptr, 0x12345678}}));
  CHECK(config_error([&] { ZipReader(path).read_bytes("config.json"); }) ==
        path + ": config.json: CRC-32 mismatch: the directory says 12345678, data has " +
            fmt::format("{:08x}", crc_of(kText)));
}

TEST_CASE("a missing member is refused with its exact message") {
  TempDir dir;
  const std::string path = write(dir, "model.keras", zip({{"config.json", kText}}));
  CHECK(config_error([&] { ZipReader(path).read_bytes("model.weights.h5"); }) ==
        path + ": model.weights.h5: no such member in the archive");
  CHECK(config_error([&] { ZipReader(dir.path() + "/absent.keras"); }) ==
        dir.path() + "/absent.keras: cannot open (No such file or directory)");
}

TEST_CASE("a truncated file is refused with its exact message") {
  TempDir dir;
  const std::string whole = zip({{"config.json", kText}, {"packed.json", kText, true}});
  // Cut anywhere, the end record is gone.
  for (size_t keep : {whole.size() - 1, whole.size() / 2, size_t{22}}) {
    const std::string path = write(dir, "cut.zip", whole.substr(0, keep));
    CHECK(config_error([&] { ZipReader{path}; }) ==
          path + ": not a zip archive (no end of central directory record)");
  }
  const std::string tiny = write(dir, "tiny.zip", whole.substr(0, 21));
  CHECK(config_error([&] { ZipReader{tiny}; }) == tiny + ": not a zip archive: 21 bytes");
  // A deflated member whose directory says it yields more than its stream does, or less.
  const std::string shorter = write(dir, "short.zip", zip({{"a", kText, true, nullptr, -1, 1000}}));
  CHECK(config_error([&] { ZipReader(shorter).read_bytes("a"); }) ==
        shorter + ": a: the deflated member yields " + std::to_string(kText.size()) +
            " bytes, the directory says 1000");
  const std::string longer = write(dir, "long.zip", zip({{"a", kText, true, nullptr, -1, 10}}));
  CHECK(config_error([&] { ZipReader(longer).read_bytes("a"); }) ==
        longer + ": a: the deflated member yields more than 10 bytes, the directory says 10");
}

TEST_CASE("a file that is not a zip archive is refused with its exact message") {
  TempDir dir;
  const std::string path = write(dir, "config.json", kText);
  CHECK(config_error([&] { ZipReader{path}; }) ==
        path + ": not a zip archive (no end of central directory record)");
  CHECK(config_error([&] { ZipReader{dir.path()}; }) ==
        dir.path() + ": not a regular file (a folder); data files must be");
}

TEST_CASE("damaged directories and members are refused, naming the file and the member") {
  TempDir dir;
  auto error = [&](const std::string& bytes, const std::string& member = "") {
    const std::string path = write(dir, "bad.zip", bytes);
    return config_error([&] {
      ZipReader archive(path);
      if (!member.empty()) archive.read_bytes(member);
    });
  };
  const std::string path = dir.path() + "/bad.zip";
  CHECK(error(zip({{"a", "1"}, {"a", "2"}})) == path + ": two members are named 'a'");

  const size_t entry = 30 + 1 + kText.size();  // where the directory's entry of "a" starts
  std::string method = zip({{"a", kText}});
  method[entry + 10] = 12;
  CHECK(error(method, "a") ==
        path + ": a: compression method 12 is not supported (stored or deflated)");

  std::string encrypted = zip({{"a", kText}});
  encrypted[entry + 8] = 1;
  CHECK(error(encrypted, "a") == path + ": a: the member is encrypted");

  std::string renamed = zip({{"a", kText}});
  renamed[30] = 'b';  // the local header's name
  CHECK(error(renamed, "a") ==
        path + ": a: bad zip archive: the local header names another member");

  std::string garbled = zip({{"a", std::string(5000, 'q'), true}});
  garbled[31] = '\xff';  // a final block of the reserved type
  CHECK(error(garbled, "a") == path + ": a: bad deflate data (invalid block type)");

  std::string moved = zip({{"a", kText}});
  REQUIRE(entry < 100);
  moved[moved.size() - 6] = 100;  // the end record's offset of the directory, now inside it
  CHECK(error(moved) == path +
                            ": bad zip archive: the central directory (47 bytes at 100) does not "
                            "end where its end record starts (" +
                            std::to_string(entry + 47) + ")");
}
