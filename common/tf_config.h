// TF_CONFIG in exactly TensorFlow's format: writing one per task, and reading one with
// TensorFlow's rules. Which process gets which TF_CONFIG is the launcher's business.
#pragma once

#include <string>
#include <string_view>

#include "common/cluster_spec.h"

namespace dtrain::common {

struct TfConfig {
  ClusterSpec cluster;
  TaskId task;
  std::string rpc_layer;    ///< optional in TensorFlow ("grpc"); kept, not used
  std::string environment;  ///< optional in TensorFlow ("cloud"); kept, not used
};

/// {"cluster": {...}, "task": {"type": "worker", "index": 0}}, byte for byte what Python's
/// json.dumps writes for the tutorial's dict. The task must be in the cluster (EnforceError).
std::string format_tf_config(const ClusterSpec& cluster, const TaskId& task);

/// Parses and validates a TF_CONFIG value: keys cluster, task (type, index), rpc_layer,
/// environment; task types chief, worker, evaluator, ps; the task must exist in the cluster.
/// Throws ConfigError "TF_CONFIG: <path>: ..." on anything else.
TfConfig parse_tf_config(std::string_view text);

}  // namespace dtrain::common
