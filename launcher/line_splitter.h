// Cuts a byte stream into lines for the logs: '\n' and '\r' end a line (progress bars redraw with
// '\r'); a line longer than max_line is cut there. Bytes are never dropped or changed.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dtrain::launcher {

class LineSplitter {
 public:
  /// on_line gets each complete line including its terminator ('\n' or '\r'); a cut overlong
  /// piece or the final partial line comes without one.
  using LineHandler = std::function<void(std::string_view line)>;

  explicit LineSplitter(LineHandler on_line, size_t max_line = 1 << 20);

  void feed(std::string_view bytes);
  /// Hands over a partial last line, if any (at end of stream).
  void finish();
  bool has_partial() const { return !partial_.empty(); }

 private:
  LineHandler on_line_;
  size_t max_line_;
  std::string partial_;
};

}  // namespace dtrain::launcher
