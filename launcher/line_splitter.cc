// See line_splitter.h.
#include "launcher/line_splitter.h"

namespace dtrain::launcher {

LineSplitter::LineSplitter(LineHandler on_line, size_t max_line)
    : on_line_(std::move(on_line)), max_line_(max_line) {}

void LineSplitter::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    size_t end = bytes.find_first_of("\n\r");
    if (end == std::string_view::npos) {
      partial_.append(bytes);
      while (partial_.size() >= max_line_) {
        on_line_(std::string_view(partial_).substr(0, max_line_));
        partial_.erase(0, max_line_);
      }
      return;
    }
    if (partial_.empty()) {
      on_line_(bytes.substr(0, end + 1));
    } else {
      partial_.append(bytes.substr(0, end + 1));
      on_line_(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(end + 1);
  }
}

void LineSplitter::finish() {
  if (partial_.empty()) return;
  std::string rest;
  rest.swap(partial_);
  on_line_(rest);
}

}  // namespace dtrain::launcher
