// TensorFlow's TF_CONFIG rules: see tf_config.h.
#include "common/tf_config.h"

#include "common/errors.h"
#include "common/json.h"

namespace dtrain::common {

std::string format_tf_config(const ClusterSpec& cluster, const TaskId& task) {
  DT_ENFORCE(cluster.has(task), "task {} is not in the cluster", task.text());
  return fmt::format("{{\"cluster\": {}, \"task\": {{\"type\": {}, \"index\": {}}}}}",
                     cluster.to_python_json(), json_quote(task.type), task.index);
}

TfConfig parse_tf_config(std::string_view text) {
  try {
    JsonDocument doc = JsonDocument::parse(text, "TF_CONFIG");
    JsonNode root = doc.root();
    root.check_keys({"cluster", "task", "rpc_layer", "environment"});
    TfConfig config;
    config.cluster = ClusterSpec::from_json(root.at("cluster"), {kChief, kWorker, kEvaluator, kPs});
    JsonNode task = root.at("task");
    task.check_keys({"type", "index", "trial"});
    config.task.type = task.at("type").as_nonempty_string();
    config.task.index = static_cast<int>(task.at("index").as_int(0, 1 << 20));
    if (config.cluster.count(config.task.type) == 0) {
      task.at("type").fail(
          fmt::format("task type \"{}\" has no addresses in cluster", config.task.type));
    }
    if (!config.cluster.has(config.task)) {
      task.at("index").fail(fmt::format("index {} is out of range: cluster.{} has {} address(es)",
                                        config.task.index, config.task.type,
                                        config.cluster.count(config.task.type)));
    }
    if (auto rpc = root.find("rpc_layer")) config.rpc_layer = rpc->as_string();
    if (auto env = root.find("environment")) config.environment = env->as_string();
    return config;
  } catch (const ConfigError& e) {
    std::string message = e.what();
    if (message.rfind("TF_CONFIG", 0) == 0) throw;
    throw ConfigError("TF_CONFIG: " + message);
  }
}

}  // namespace dtrain::common
