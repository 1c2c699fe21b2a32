// See timeline.h.
#include "worker/train/timeline.h"

#include <fmt/format.h>

#include "common/clock.h"

namespace dtrain::train {

Timeline::Timeline() {
  mark("main");
}

void Timeline::mark(const std::string& phase) {
  marks_.emplace_back(phase, common::monotonic_seconds());
}

std::string Timeline::summary() const {
  std::string text = fmt::format("main at CLOCK_MONOTONIC {:.6f}", marks_.front().second);
  for (size_t i = 1; i < marks_.size(); ++i) {
    text += fmt::format("; {} +{:.3f} s", marks_[i].first, marks_[i].second - marks_[i - 1].second);
  }
  return text;
}

}  // namespace dtrain::train
