// The merged live view: each worker line on stdout behind a "[worker 1] " prefix, coloured only on
// a terminal and without NO_COLOR. Lines are written whole, so workers never interleave mid-line.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

#include "common/cluster_spec.h"

namespace dtrain::launcher {

class Console {
 public:
  /// out is not owned. interactive: a terminal, where the status line is redrawn in place.
  Console(std::FILE* out, bool colour, bool interactive = false);
  /// stdout, coloured when it is a terminal and NO_COLOR is unset.
  static Console for_stdout();

  /// Prints one line behind the task's prefix ("[worker 1] "; colour by task), or bare when
  /// raw. A "\r\n", '\n' or '\r' ending is shown as one line end; a missing ending is added.
  void print_line(const common::TaskId& task, std::string_view line, bool raw = false);
  /// The live view: on a terminal one status line kept below the worker lines and redrawn in
  /// place; otherwise printed as a plain "[dtrain] ..." line.
  void set_status(const std::string& text);
  bool interactive() const { return interactive_; }
  /// Ends the live line (it stays on screen) so what follows starts on a line of its own.
  void finish();
  /// Flushes what print_line buffered (and redraws the status line on a terminal).
  void flush();
  /// For output that does not go through the console but reaches the same terminal (the
  /// launcher's log on stderr): erases the live line, writes what print_line buffered, runs
  /// write, then redraws the live line below it. Not thread-safe, like the rest of Console.
  void print_outside(const std::function<void()>& write);

 private:
  std::FILE* out_;
  bool colour_;
  bool interactive_;
  std::string status_;           ///< the live line on a terminal
  bool status_cleared_ = false;  ///< erased for worker lines; redrawn by flush()
  std::string buffer_;
};

}  // namespace dtrain::launcher
