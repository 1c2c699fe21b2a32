// Cuts a byte stream into lines for the logs: "\r\n", '\n' and '\r' end a line (progress bars
// redraw with '\r'); a line longer than max_line is cut there. Bytes are never dropped or changed.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dtrain::launcher {

class LineSplitter {
 public:
  /// on_line gets each complete line including its terminator ("\r\n", '\n' or '\r'); a cut
  /// overlong piece or the final partial line comes without one.
  using LineHandler = std::function<void(std::string_view line)>;

  explicit LineSplitter(LineHandler on_line, size_t max_line = 1 << 20);

  /// A '\r' at the end of bytes is held (its line with it) until the next byte shows whether
  /// "\r\n" ends the line, so "\r\n" split across two reads is still one line end.
  void feed(std::string_view bytes);
  /// Hands over a partial last line, if any (at end of stream), or the line of a held '\r'.
  void finish();
  bool has_partial() const { return !partial_.empty(); }

 private:
  void hand_over_partial();

  LineHandler on_line_;
  size_t max_line_;
  std::string partial_;
  bool cr_held_ = false;  ///< partial_ ends with a '\r' that ends its line
};

}  // namespace dtrain::launcher
