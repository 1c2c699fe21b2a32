// See line_splitter.h.
#include "launcher/line_splitter.h"

namespace dtrain::launcher {

LineSplitter::LineSplitter(LineHandler on_line, size_t max_line)
    : on_line_(std::move(on_line)), max_line_(max_line) {}

// partial_ always holds fewer than max_line_ bytes, so a line is at most max_line_ bytes and
// its terminator, and a cut piece exactly max_line_ bytes, however the stream is split into
// reads.
void LineSplitter::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t room = max_line_ - partial_.size();
    const size_t end = bytes.substr(0, room + 1).find_first_of("\n\r");
    size_t take = 0;
    if (end != std::string_view::npos) {
      take = end + 1;
    } else if (bytes.size() >= room) {
      take = room;  // no terminator within max_line_ bytes: cut here
    } else {
      partial_.append(bytes);
      return;
    }
    if (partial_.empty()) {
      on_line_(bytes.substr(0, take));
    } else {
      partial_.append(bytes.substr(0, take));
      on_line_(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(take);
  }
}

void LineSplitter::finish() {
  if (partial_.empty()) return;
  std::string rest;
  rest.swap(partial_);
  on_line_(rest);
}

}  // namespace dtrain::launcher
