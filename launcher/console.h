// The merged live view: each worker line on stdout behind a "[worker 1] " prefix, coloured only on
// a terminal and without NO_COLOR. Lines are written whole, so workers never interleave mid-line.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace dtrain::launcher {

class Console {
 public:
  /// out is not owned. colour: "auto" decides from isatty(out) and NO_COLOR.
  explicit Console(std::FILE* out, bool colour);
  static Console for_stdout();

  /// Prints one line with the prefix of role (e.g. "worker 1"); colour_index picks the colour.
  /// A '\r' ending is shown as a line end; a missing ending is added.
  void print_line(const std::string& role, int colour_index, std::string_view line);
  /// Flushes what print_line buffered.
  void flush();

 private:
  std::FILE* out_;
  bool colour_;
  std::string buffer_;
};

}  // namespace dtrain::launcher
