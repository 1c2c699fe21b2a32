// The event-file writer on its own: CRC-32C and TFRecord framing against published values, and
// a write cut short by a full disk (a file size limit in a child process) leaving only whole
// records, read back by read_tfevents.py; a folder that cannot be made fails without throwing.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "test/support/temp_dir.h"
#include "test/train/tfevents_reader.h"
#include "worker/train/event_file.h"

using namespace dtrain;
namespace fs = std::filesystem;

TEST_CASE("CRC-32C and TFRecord framing match published values") {
  CHECK(train::crc32c("123456789") == 0xE3069283u);  // the standard check value
  // RFC 3720 (iSCSI), appendix B.4.
  CHECK(train::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(train::crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(train::crc32c(ascending) == 0x46DD794Eu);
  // Every TF event file begins 18 00 00 00 00 00 00 00 a3 7f 4b 22: a 24-byte first record and
  // the masked CRC of that length.
  std::string length_24("\x18\0\0\0\0\0\0\0", 8);
  CHECK(train::masked_crc32c(length_24) == 0x224B7FA3u);
  std::string record = train::tfrecord(std::string(24, 'x'));
  CHECK(record.size() == 24 + 16);
  CHECK(record.substr(0, 12) == length_24 + std::string("\xa3\x7f\x4b\x22", 4));
  uint32_t data_crc = train::masked_crc32c(std::string(24, 'x'));
  CHECK(record.substr(36) == std::string(reinterpret_cast<const char*>(&data_crc), 4));
}

TEST_CASE("a write cut short by a full disk leaves only whole records, then nothing is written") {
  testing::TempDir dir;
  std::string folder = dir.path() + "/train";
  // In a child, the file size limit stands in for a full disk: write() stops at it.
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{2000, 2000};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    train::EventFileWriter writer(folder);
    for (int step = 1; step <= 3; ++step)
      writer.add(train::encode_scalar_event(train::wall_time_now(), step, {{"batch_loss", 0.5f}}));
    writer.flush();  // about 300 bytes: whole
    for (int step = 4; step <= 40; ++step)
      writer.add(train::encode_scalar_event(train::wall_time_now(), step, {{"batch_loss", 0.5f}}));
    writer.flush();  // crosses the limit part-way: cut back
    bool cut = writer.failed();
    writer.add(train::encode_scalar_event(train::wall_time_now(), 41, {{"batch_loss", 0.5f}}));
    writer.flush();
    ::_exit(cut ? 0 : 3);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::vector<testing::EventFile> files = testing::read_events(folder);
  REQUIRE(files.size() == 1);
  REQUIRE(files[0].scalars.size() == 3);
  CHECK(files[0].scalars.back().step == 3);
  CHECK(fs::file_size(folder + "/" + files[0].name) < 2000);

  // A folder that cannot be made: failed from the start, and nothing throws.
  std::ofstream(dir.path() + "/file") << "";
  train::EventFileWriter blocked(dir.path() + "/file/train");
  CHECK(blocked.failed());
  CHECK(blocked.path().empty());
  blocked.add(train::encode_scalar_event(train::wall_time_now(), 1, {{"batch_loss", 0.5f}}));
  blocked.flush();
}
