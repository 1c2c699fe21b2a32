// The line splitters: the launcher's (launcher/process/line_splitter.h: whatever the bytes and
// however they are cut into reads, the lines put together are the input, the same lines as from one
// read, no line is longer than the limit and its terminator, and only a line's end ("\r\n" or
// its last byte) may be a terminator) and `dtrain logs`' (LogLineSplitter: the same lines
// whether the bytes come in one read or many). The first byte picks the limit, the second the
// size of the reads.
#include <string>
#include <vector>

#include "launcher/process/line_splitter.h"
#include "launcher/view/log_follower.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  if (size < 2) return 0;
  const size_t max_line = 1 + data[0] % 64;
  const size_t read_size = 1 + data[1] % 17;
  const std::string_view input = fuzz::as_text(data + 2, size - 2);
  std::string joined;
  std::vector<std::string> lines, lines_at_once;
  bool ok = true;
  launcher::LineSplitter splitter(
      [&](std::string_view line) {
        size_t end = line.size() >= 2 && line.substr(line.size() - 2) == "\r\n" ? 2 : 1;
        ok = ok && !line.empty() && line.size() <= max_line + end;
        for (size_t i = 0; i + end < line.size(); ++i)
          ok = ok && line[i] != '\n' && line[i] != '\r';
        joined.append(line);
        lines.emplace_back(line);
      },
      max_line);
  for (size_t at = 0; at < input.size(); at += read_size)
    splitter.feed(input.substr(at, read_size));
  splitter.finish();
  launcher::LineSplitter one_read([&](std::string_view line) { lines_at_once.emplace_back(line); },
                                  max_line);
  one_read.feed(input);
  one_read.finish();
  fuzz::require(ok, "lines are bounded and end at their terminator");
  fuzz::require(joined == input, "the lines put together are the input");
  fuzz::require(lines == lines_at_once, "the lines do not depend on how the bytes were read");
  fuzz::require(!splitter.has_partial(), "finish hands over the partial line");

  std::vector<std::string> whole, pieces;
  launcher::LogLineSplitter at_once, in_reads;
  at_once.feed(input, whole);
  for (size_t at = 0; at < input.size(); at += read_size)
    in_reads.feed(input.substr(at, read_size), pieces);
  fuzz::require(whole == pieces, "log lines do not depend on how the bytes were read");
  fuzz::require(at_once.take_partial() == in_reads.take_partial(),
                "the partial log line does not depend on how the bytes were read");
  return 0;
}
