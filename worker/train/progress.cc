// See progress.h.
#include "worker/train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace dtrain::train {

std::string format_progress(int64_t step, int64_t steps, double seconds,
                            const std::vector<std::pair<std::string, double>>& values,
                            int64_t first_step) {
  constexpr int kWidth = 30;
  int filled = steps > 0 ? static_cast<int>(kWidth * step / steps) : kWidth;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), '.');
  const int64_t done = step - std::min(first_step, step);
  double per_step_ms = done > 0 ? seconds * 1000.0 / static_cast<double>(done) : 0;
  std::string text = fmt::format("{}/{} [{}] - {:.0f}s {:.0f}ms/step", step, steps, bar,
                                 std::floor(seconds), per_step_ms);
  for (const auto& [name, value] : values) text += fmt::format(" - {}: {:.4f}", name, value);
  return text;
}

ProgressBar ProgressBar::for_stdout(double line_seconds) {
  return ProgressBar(stdout, ::isatty(STDOUT_FILENO) == 1, line_seconds);
}

void ProgressBar::begin_epoch(int epoch, int epochs, int64_t first_step) {
  first_step_ = first_step;
  std::fprintf(out_, "Epoch %d/%d\n", epoch, epochs);
  std::fflush(out_);
  last_draw_ = -1;
}

void ProgressBar::update(int64_t step, int64_t steps, double seconds,
                         const std::vector<std::pair<std::string, double>>& values) {
  if (!interactive_) {  // a whole line, at most one per line_seconds_; the epoch's end has its own
    if (line_seconds_ <= 0 || step >= steps || seconds - std::max(last_draw_, 0.0) < line_seconds_)
      return;
    last_draw_ = seconds;
    std::fprintf(out_, "%s\n", format_progress(step, steps, seconds, values, first_step_).c_str());
    std::fflush(out_);
    return;
  }
  if (last_draw_ >= 0 && seconds - last_draw_ < 0.05) return;
  last_draw_ = seconds;
  std::fprintf(out_, "\r%s", format_progress(step, steps, seconds, values, first_step_).c_str());
  std::fflush(out_);
}

void ProgressBar::end_epoch(int64_t steps, double seconds,
                            const std::vector<std::pair<std::string, double>>& values) {
  std::fprintf(out_, "%s%s\n", interactive_ ? "\r" : "",
               format_progress(steps, steps, seconds, values, first_step_).c_str());
  std::fflush(out_);
}

}  // namespace dtrain::train
