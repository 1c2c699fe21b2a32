// The line splitters: the launcher's (launcher/line_splitter.h: whatever the bytes and however
// they are cut into reads, the lines put together are the input, no line is longer than the
// limit and its terminator, and only a line's last byte may be a terminator) and `dtrain logs`'
// (LogLineSplitter: the same lines whether the bytes come in one read or many). The first byte
// picks the limit, the second the size of the reads.
#include <string>
#include <vector>

#include "launcher/line_splitter.h"
#include "launcher/log_follower.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  if (size < 2) return 0;
  const size_t max_line = 1 + data[0] % 64;
  const size_t read_size = 1 + data[1] % 17;
  const std::string_view input = fuzz::as_text(data + 2, size - 2);
  std::string joined;
  bool ok = true;
  launcher::LineSplitter splitter(
      [&](std::string_view line) {
        ok = ok && !line.empty() && line.size() <= max_line + 1;
        for (size_t i = 0; i + 1 < line.size(); ++i) ok = ok && line[i] != '\n' && line[i] != '\r';
        joined.append(line);
      },
      max_line);
  for (size_t at = 0; at < input.size(); at += read_size)
    splitter.feed(input.substr(at, read_size));
  splitter.finish();
  fuzz::require(ok, "lines are bounded and end at their terminator");
  fuzz::require(joined == input, "the lines put together are the input");
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
