// TF_CONFIG: golden strings in TensorFlow's exact format, TensorFlow's chief and id rules, and
// rejection of every malformed value in support/bad_inputs.h.
#include <catch2/catch.hpp>

#include "common/errors.h"
#include "common/job_spec.h"
#include "common/tf_config.h"
#include "test/support/bad_inputs.h"

using namespace dtrain::common;

namespace {
ClusterSpec tutorial_cluster() {
  return ClusterSpec({{"worker", {"localhost:12345", "localhost:23456"}}});
}
}  // namespace

TEST_CASE("TF_CONFIG is byte for byte what Python's json.dumps writes in the tutorial") {
  CHECK(
      format_tf_config(tutorial_cluster(), {"worker", 0}) ==
      R"({"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": {"type": "worker", "index": 0}})");
  CHECK(
      format_tf_config(tutorial_cluster(), {"worker", 1}) ==
      R"({"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": {"type": "worker", "index": 1}})");
}

TEST_CASE("TF_CONFIG keeps the job file's task-type order, with chief and evaluator") {
  JobSpec spec = parse_job_spec(R"({"job": "j", "train": {}, "cluster":
      {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"], "evaluator": ["host3:2222"]}})",
                                "x");
  CHECK(
      format_tf_config(spec.cluster, {"evaluator", 0}) ==
      R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"], "evaluator": ["host3:2222"]}, "task": {"type": "evaluator", "index": 0}})");
}

TEST_CASE("a TF_CONFIG we write parses back to the same cluster and task") {
  ClusterSpec cluster({{"chief", {"a:1"}}, {"worker", {"b:2", "c:3"}}});
  for (const TaskId& task : cluster.tasks()) {
    TfConfig parsed = parse_tf_config(format_tf_config(cluster, task));
    CHECK(parsed.task == task);
    CHECK(parsed.cluster.to_python_json() == cluster.to_python_json());
  }
}

TEST_CASE("chief is the chief task, else worker 0 (TensorFlow's rule)") {
  ClusterSpec workers_only({{"worker", {"a:1", "b:2"}}});
  CHECK(workers_only.chief() == TaskId{"worker", 0});
  CHECK(workers_only.is_chief({"worker", 0}));
  CHECK_FALSE(workers_only.is_chief({"worker", 1}));

  ClusterSpec with_chief({{"worker", {"a:1", "b:2"}}, {"chief", {"c:3"}}, {"evaluator", {"d:4"}}});
  CHECK(with_chief.chief() == TaskId{"chief", 0});
  CHECK_FALSE(with_chief.is_chief({"worker", 0}));
}

TEST_CASE("ring ids: chief 0, worker i -> i + number of chiefs; evaluator outside the ring") {
  ClusterSpec with_chief({{"worker", {"a:1", "b:2"}}, {"chief", {"c:3"}}, {"evaluator", {"d:4"}}});
  CHECK(with_chief.ring_size() == 3);
  CHECK(with_chief.ring_rank({"chief", 0}) == 0);
  CHECK(with_chief.ring_rank({"worker", 0}) == 1);
  CHECK(with_chief.ring_rank({"worker", 1}) == 2);
  CHECK_FALSE(with_chief.ring_rank({"evaluator", 0}).has_value());
  CHECK_FALSE(with_chief.ring_rank({"worker", 2}).has_value());
  std::vector<TaskId> ring = with_chief.training_tasks();
  REQUIRE(ring.size() == 3);
  CHECK(ring[0] == TaskId{"chief", 0});
  CHECK(ring[2] == TaskId{"worker", 1});

  ClusterSpec workers_only({{"worker", {"a:1", "b:2"}}});
  CHECK(workers_only.ring_rank({"worker", 1}) == 1);
}

TEST_CASE("TensorFlow's optional keys and ps tasks are accepted when parsing") {
  TfConfig config = parse_tf_config(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]},
          "task": {"type": "ps", "index": 0}, "rpc_layer": "grpc", "environment": "cloud"})");
  CHECK(config.task == TaskId{"ps", 0});
  CHECK(config.rpc_layer == "grpc");
  CHECK(config.environment == "cloud");
  CHECK_FALSE(config.cluster.ring_rank(config.task).has_value());
}

TEST_CASE("every malformed TF_CONFIG is a ConfigError naming what and where") {
  for (const auto& c : dtrain::testing::bad_tf_configs()) {
    INFO("case: " << c.name);
    try {
      parse_tf_config(c.text);
      FAIL("accepted a malformed TF_CONFIG");
    } catch (const ConfigError& e) {
      INFO("message: " << e.what());
      CHECK(std::string(e.what()).find(c.expected) != std::string::npos);
    }
  }
}

TEST_CASE("task ids parse from TYPE:INDEX") {
  CHECK(parse_task_id("worker:12") == TaskId{"worker", 12});
  CHECK(parse_task_id("chief:0") == TaskId{"chief", 0});
  for (const char* bad : {"worker", "worker:", ":1", "worker:-1", "worker:x", "worker:1234567"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_task_id(bad), ConfigError);
  }
}

TEST_CASE("a TF_CONFIG nested thousands of levels deep is a ConfigError, not a crash") {
  std::string deep =
      "{\"cluster\": {\"worker\": [\"h:1\"]}, \"task\": {\"type\": \"worker\", "
      "\"index\": 0}, \"environment\": " +
      std::string(10000, '[') + std::string(10000, ']') + "}";
  CHECK_THROWS_WITH(parse_tf_config(deep), Catch::StartsWith("TF_CONFIG: line 1, column ") &&
                                               Catch::Contains("levels deep"));
}
