// The launcher's own log lines (spdlog, on stderr) around the live status line: while a route is
// in place, each log line erases the status line, is written by the logger's own sinks (format
// and colour unchanged), and the status line is redrawn below it. It changes nothing when the
// console is not a terminal, and routes nothing but the default logger.
#pragma once

#include <memory>

#include "launcher/view/console.h"

namespace dtrain::launcher {

class ConsoleLogRoute {
 public:
  /// Routes the default logger's sinks through console.print_outside() while this object lives;
  /// console must outlive it. A no-op unless console.interactive(). Call on the thread that
  /// logs and uses the console (the launcher's one thread).
  explicit ConsoleLogRoute(Console& console);
  ~ConsoleLogRoute();  ///< gives the default logger its own sinks back
  ConsoleLogRoute(const ConsoleLogRoute&) = delete;
  ConsoleLogRoute& operator=(const ConsoleLogRoute&) = delete;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;  ///< null when nothing was routed
};

}  // namespace dtrain::launcher
