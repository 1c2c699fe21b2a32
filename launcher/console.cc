// See console.h.
#include "launcher/console.h"

#include <fmt/format.h>
#include <unistd.h>

#include "common/env_vars.h"

namespace dtrain::launcher {

Console::Console(std::FILE* out, bool colour) : out_(out), colour_(colour) {}

Console Console::for_stdout() {
  bool colour = ::isatty(STDOUT_FILENO) == 1 && !common::get_env(common::kEnvNoColor).has_value();
  return Console(stdout, colour);
}

void Console::print_line(const std::string& role, int colour_index, std::string_view line) {
  static constexpr int kColours[] = {36, 33, 35, 32, 34, 31};  // cyan, yellow, magenta, ...
  if (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (colour_) {
    int code = kColours[static_cast<size_t>(colour_index) % std::size(kColours)];
    buffer_ += fmt::format("\x1b[{}m[{}]\x1b[0m ", code, role);
  } else {
    buffer_ += fmt::format("[{}] ", role);
  }
  buffer_.append(line);
  buffer_ += '\n';
  if (buffer_.size() > (1 << 16)) flush();
}

void Console::flush() {
  if (buffer_.empty()) return;
  std::fwrite(buffer_.data(), 1, buffer_.size(), out_);
  std::fflush(out_);
  buffer_.clear();
}

}  // namespace dtrain::launcher
