// A worker's start-up, phase by phase on CLOCK_MONOTONIC (main, data loaded, rendezvous, model
// built, checkpoint read, state broadcast, first step), logged once after the first step so that
// start-up and recovery time can be broken down (scripts/bench-recovery.sh). Only records and
// formats; the callers decide where the phases end.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::train {

class Timeline {
 public:
  /// Marks "main": the start of everything after it.
  Timeline();
  /// Marks the end of phase now.
  void mark(const std::string& phase);
  /// "main at CLOCK_MONOTONIC 1234.567890; data +0.412 s; rendezvous +0.051 s; ...": each
  /// phase's time since the mark before it.
  std::string summary() const;

 private:
  std::vector<std::pair<std::string, double>> marks_;
};

}  // namespace dtrain::train
