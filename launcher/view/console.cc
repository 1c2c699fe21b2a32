// See console.h.
#include "launcher/view/console.h"

#include <fmt/format.h>
#include <unistd.h>

#include "common/env_vars.h"
#include "common/logging.h"

namespace dtrain::launcher {

Console::Console(std::FILE* out, bool colour, bool interactive)
    : out_(out), colour_(colour), interactive_(interactive) {}

Console Console::for_stdout() {
  bool terminal = ::isatty(STDOUT_FILENO) == 1;
  return Console(stdout, terminal && !common::get_env(common::kEnvNoColor).has_value(), terminal);
}

void Console::print_line(const common::TaskId& task, std::string_view line, bool raw) {
  static constexpr int kWorkerColours[] = {36, 32, 34, 96, 92, 94};  // cyans, greens, blues
  if (line.size() >= 2 && line.substr(line.size() - 2) == "\r\n")
    line.remove_suffix(2);
  else if (!line.empty() && (line.back() == '\n' || line.back() == '\r'))
    line.remove_suffix(1);
  if (interactive_ && !status_.empty() && !status_cleared_) {
    buffer_ += "\r\x1b[K";  // erase the status line; flush() puts it back below
    status_cleared_ = true;
  }
  if (!raw) {
    std::string role = "[" + common::role_name(task.type, task.index) + "]";
    if (colour_) {
      int code = task.type == common::kChief       ? 35
                 : task.type == common::kEvaluator ? 33
                                                   : kWorkerColours[task.index % 6];
      buffer_ += fmt::format("\x1b[{}m{}\x1b[0m ", code, role);
    } else {
      buffer_ += role + " ";
    }
  }
  buffer_.append(line);
  buffer_ += '\n';
  if (buffer_.size() > (1 << 16)) flush();
}

void Console::set_status(const std::string& text) {
  if (!interactive_) {
    buffer_ += "[dtrain] " + text + "\n";
    return flush();
  }
  if (!status_cleared_ && !status_.empty()) buffer_ += "\r\x1b[K";
  status_ = text;
  status_cleared_ = true;
  flush();
}

void Console::finish() {
  flush();
  if (interactive_ && !status_.empty()) {
    std::fputs("\n", out_);
    std::fflush(out_);
    status_.clear();
  }
}

void Console::print_outside(const std::function<void()>& write) {
  if (interactive_ && !status_.empty() && !status_cleared_) {
    buffer_ += "\r\x1b[K";
    status_cleared_ = true;
  }
  if (!buffer_.empty()) {  // worker lines first, so the order on screen is the order of events
    std::fwrite(buffer_.data(), 1, buffer_.size(), out_);
    buffer_.clear();
  }
  std::fflush(out_);
  write();
  flush();
}

void Console::flush() {
  if (interactive_ && status_cleared_ && !status_.empty()) {
    buffer_ += status_;
    status_cleared_ = false;
  }
  if (buffer_.empty()) return;
  std::fwrite(buffer_.data(), 1, buffer_.size(), out_);
  std::fflush(out_);
  buffer_.clear();
}

}  // namespace dtrain::launcher
