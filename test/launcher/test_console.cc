// The live status line and the launcher's own log lines on one terminal: with ConsoleLogRoute in
// place a log line erases the status line, stands on a line of its own and the status line is
// redrawn below it; without a terminal nothing is routed. A small terminal model (\r, ESC[K,
// \n) turns the bytes into what a person would see.
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/view/console.h"
#include "launcher/view/console_log_sink.h"
#include "test/support/temp_dir.h"

using namespace dtrain::launcher;

namespace {

// Writes "<level letter> <message>\n" to the FILE the console writes to.
class FileSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FileSink(std::FILE* out) : out_(out) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    spdlog::memory_buf_t text;
    formatter_->format(message, text);
    std::fwrite(text.data(), 1, text.size(), out_);
  }
  void flush_() override { std::fflush(out_); }

 private:
  std::FILE* out_;
};

// A default logger writing to out for the test's length; the previous one is put back after.
struct TestLogger {
  explicit TestLogger(std::FILE* out) : previous(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("test", std::make_shared<FileSink>(out));
    logger->set_pattern("%L %v");
    spdlog::set_default_logger(logger);
  }
  ~TestLogger() { spdlog::set_default_logger(previous); }
  std::shared_ptr<spdlog::logger> previous;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// What a terminal shows for bytes with \r (column 0), ESC[K (erase to the line's end) and \n.
std::vector<std::string> screen(const std::string& bytes) {
  std::vector<std::string> lines(1);
  size_t column = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string& line = lines.back();
    if (bytes[i] == '\r') {
      column = 0;
    } else if (bytes.compare(i, 3, "\x1b[K") == 0) {
      line.resize(column);
      i += 2;
    } else if (bytes[i] == '\n') {
      lines.emplace_back();
      column = 0;
    } else {
      if (column < line.size())
        line[column] = bytes[i];
      else
        line += bytes[i];
      ++column;
    }
  }
  return lines;
}

}  // namespace

TEST_CASE("a log line under a live status line stands on its own and the status is redrawn") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/terminal";
  std::FILE* out = std::fopen(path.c_str(), "w");
  REQUIRE(out != nullptr);
  {
    TestLogger logger(out);
    Console console(out, false, true);
    ConsoleLogRoute route(console);
    console.set_status("epoch 1/3  ETA 62s");
    spdlog::warn("worker:1 preempted");
    console.print_line({"worker", 0}, "step done\n");
    spdlog::info("restarting");  // after a worker line that print_line still holds
    console.set_status("epoch 1/3  ETA 61s");
    console.finish();
  }
  std::fclose(out);
  std::string bytes = read_all(path);
  INFO(bytes);
  CHECK(bytes.find("ETA 62sW") == std::string::npos);  // the bug: the log glued to the status
  CHECK(bytes.rfind("epoch 1/3  ETA 62s\r\x1b[KW worker:1 preempted\nepoch 1/3  ETA 62s", 0) == 0);
  std::vector<std::string> expected = {"W worker:1 preempted", "[worker 0] step done",
                                       "I restarting", "epoch 1/3  ETA 61s", ""};
  CHECK(screen(bytes) == expected);
}

TEST_CASE("the log route gives the logger its sinks back and does nothing off a terminal") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/out";
  std::FILE* out = std::fopen(path.c_str(), "w");
  REQUIRE(out != nullptr);
  {
    TestLogger logger(out);
    const std::vector<spdlog::sink_ptr> own = spdlog::default_logger()->sinks();
    Console terminal(out, false, true);
    {
      ConsoleLogRoute route(terminal);
      CHECK(spdlog::default_logger()->sinks() != own);
    }
    CHECK(spdlog::default_logger()->sinks() == own);
    Console plain(out, false, false);
    ConsoleLogRoute route(plain);
    CHECK(spdlog::default_logger()->sinks() == own);
    plain.set_status("epoch 1/3");
    spdlog::warn("worker:1 preempted");
  }
  std::fclose(out);
  CHECK(read_all(path) == "[dtrain] epoch 1/3\nW worker:1 preempted\n");
}
