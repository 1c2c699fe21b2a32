// Worker lines on their way to the console: the LineSplitter keeps every byte and terminator,
// takes "\r\n" as one line end even when a read ends between '\r' and '\n' (issue 25: the console
// showed an empty "[worker 0]" line after each CRLF line), and the Console prints each line once.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/process/line_splitter.h"
#include "launcher/view/console.h"
#include "test/support/temp_dir.h"

using dtrain::launcher::Console;
using dtrain::launcher::LineSplitter;

namespace {

// The lines a splitter hands over for bytes fed in the given reads, then finish().
std::vector<std::string> split(const std::vector<std::string>& reads, size_t max_line = 1 << 20) {
  std::vector<std::string> lines;
  LineSplitter splitter([&](std::string_view line) { lines.emplace_back(line); }, max_line);
  for (const std::string& bytes : reads) splitter.feed(bytes);
  splitter.finish();
  return lines;
}

using Lines = std::vector<std::string>;

}  // namespace

TEST_CASE("line splitter: CRLF is one line end, however the reads split it", "[console]") {
  const Lines crlf = {"a\r\n", "b\r\n"};
  CHECK(split({"a\r\nb\r\n"}) == crlf);
  CHECK(split({"a\r", "\nb\r\n"}) == crlf);
  CHECK(split({"a", "\r", "\n", "b\r", "\n"}) == crlf);
  std::string all = "a\r\nb\r\n";
  for (size_t cut = 0; cut <= all.size(); ++cut) {
    INFO("cut at " << cut);
    CHECK(split({all.substr(0, cut), all.substr(cut)}) == crlf);
  }
}

TEST_CASE("line splitter: a lone CR still ends a line, bytes kept as they came", "[console]") {
  CHECK(split({"1/3\r2/3\r3/3\n"}) == Lines{"1/3\r", "2/3\r", "3/3\n"});
  CHECK(split({"1/3\r", "2/3\r", "3/3\r"}) == Lines{"1/3\r", "2/3\r", "3/3\r"});  // at finish
  CHECK(split({"a\r\r\nb"}) == Lines{"a\r", "\r\n", "b"});
  CHECK(split({"a\n\nb\r\n\r\n"}) == Lines{"a\n", "\n", "b\r\n", "\r\n"});
  // A held '\r' is handed over before the next line starts.
  std::vector<std::string> lines;
  LineSplitter splitter([&](std::string_view line) { lines.emplace_back(line); });
  splitter.feed("x\r");
  CHECK(lines.empty());
  CHECK(splitter.has_partial());
  splitter.feed("y\n");
  CHECK(lines == Lines{"x\r", "y\n"});
  CHECK_FALSE(splitter.has_partial());
}

TEST_CASE("line splitter: an overlong line is cut at max_line bytes", "[console]") {
  CHECK(split({"0123456789\r\n"}, 4) == Lines{"0123", "4567", "89\r\n"});
  CHECK(split({"0123\r", "\n"}, 4) == Lines{"0123\r\n"});
  CHECK(split({"01234"}, 4) == Lines{"0123", "4"});
}

TEST_CASE("console: a CRLF line is printed once, without an empty line after it", "[console]") {
  dtrain::testing::TempDir dir;
  std::string path = dir.path() + "/out";
  std::FILE* out = std::fopen(path.c_str(), "w");
  REQUIRE(out != nullptr);
  {
    Console console(out, false, false);
    // As the supervisor wires them: each line the splitter hands over goes to print_line.
    LineSplitter splitter([&](std::string_view line) { console.print_line({"worker", 0}, line); });
    splitter.feed("a\r\nb\r");
    splitter.feed("\nunreachable\r\n");
    splitter.finish();
    console.print_line({"worker", 0}, "c\r\n");
    console.finish();
  }
  std::fclose(out);
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str() == "[worker 0] a\n[worker 0] b\n[worker 0] unreachable\n[worker 0] c\n");
}
