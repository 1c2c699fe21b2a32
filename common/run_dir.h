// The run directory's layout (DESIGN.md, "The run directory"): paths only, no I/O.
#pragma once

#include <string>

#include "common/cluster_spec.h"

namespace dtrain::common {

class RunDir {
 public:
  /// root should be absolute for anything handed to a worker (DTRAIN_RUN_DIR).
  explicit RunDir(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  std::string spec_json() const { return root_ + "/spec.json"; }
  std::string state_json() const { return root_ + "/state.json"; }
  std::string events_jsonl() const { return root_ + "/events.jsonl"; }
  std::string logs_dir() const { return root_ + "/logs"; }
  /// logs/worker-<i>.log for worker i; logs/chief-0.log, logs/evaluator-0.log for the others.
  std::string log_file(const TaskId& task) const {
    return logs_dir() + "/" + task.type + "-" + std::to_string(task.index) + ".log";
  }
  std::string backup_dir() const { return root_ + "/backup"; }
  std::string model_dir() const { return root_ + "/model"; }
  std::string metrics_jsonl() const { return root_ + "/metrics.jsonl"; }

 private:
  std::string root_;
};

}  // namespace dtrain::common
