// See line_splitter.h.
#include "launcher/process/line_splitter.h"

namespace dtrain::launcher {

LineSplitter::LineSplitter(LineHandler on_line, size_t max_line)
    : on_line_(std::move(on_line)), max_line_(max_line) {}

// partial_ holds at most max_line_ bytes (and a held '\r'), so a line is at most max_line_ bytes
// and its terminator, and a cut piece exactly max_line_ bytes, however the stream is split into
// reads: max_line_ bytes without a terminator wait for the next byte, which says whether they
// end a line ("x\r\n" whole) or are cut.
void LineSplitter::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    if (cr_held_) {  // the '\r' ended its line; "\r\n" is one line end
      if (bytes.front() == '\n') {
        partial_ += '\n';
        bytes.remove_prefix(1);
      }
      hand_over_partial();
      continue;
    }
    const size_t room = max_line_ - partial_.size();
    const size_t end = bytes.substr(0, room + 1).find_first_of("\n\r");
    size_t take = 0;
    if (end == std::string_view::npos) {
      if (bytes.size() <= room) {
        partial_.append(bytes);
        return;
      }
      take = room;  // no terminator within max_line_ bytes: cut here
    } else if (bytes[end] == '\n') {
      take = end + 1;
    } else if (end + 1 == bytes.size()) {
      partial_.append(bytes);  // a '\r' last: wait for the next byte
      cr_held_ = true;
      return;
    } else {
      take = end + (bytes[end + 1] == '\n' ? 2 : 1);
    }
    if (partial_.empty()) {
      on_line_(bytes.substr(0, take));
    } else {
      partial_.append(bytes.substr(0, take));
      hand_over_partial();
    }
    bytes.remove_prefix(take);
  }
}

void LineSplitter::finish() {
  if (!partial_.empty()) hand_over_partial();
}

// Cleared before on_line_ runs, so the handler sees a splitter at a line start.
void LineSplitter::hand_over_partial() {
  std::string line;
  line.swap(partial_);
  cr_held_ = false;
  on_line_(line);
}

}  // namespace dtrain::launcher
