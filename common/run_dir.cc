// The few run-directory helpers that are more than a path.
#include "common/run_dir.h"

#include <fmt/format.h>

namespace dtrain::common {

std::string attempt_header(int attempt, const TaskId& task, int pid, const std::string& utc_time,
                           int generation) {
  std::string started_in = generation > 0 ? fmt::format(", generation {}", generation) : "";
  return fmt::format("{}{} of {} (pid {}{}) started {} ====", kAttemptHeaderPrefix, attempt,
                     task.text(), pid, started_in, utc_time);
}

bool is_final_status(const std::string& status) {
  return status == kStatusSucceeded || status == kStatusFailed || status == kStatusStopped;
}

}  // namespace dtrain::common
