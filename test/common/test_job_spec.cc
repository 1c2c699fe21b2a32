// Job-file parsing: the shipped configs parse, defaults are Keras's and docs/job-file.md's, and
// every malformed file in support/bad_inputs.h is a ConfigError naming its JSON path.
#include <catch2/catch.hpp>
#include <set>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/job_spec.h"
#include "common/json.h"
#include "common/tf_config.h"
#include "test/support/bad_inputs.h"
#include "test/support/temp_dir.h"

using namespace dtrain::common;

TEST_CASE("every malformed job file is a ConfigError naming what and where") {
  const auto& cases = dtrain::testing::bad_job_files();
  REQUIRE(cases.size() >= 30);
  for (const auto& c : cases) {
    INFO("case: " << c.name);
    try {
      parse_job_spec(c.text, "job.json");
      FAIL("accepted a malformed job file");
    } catch (const ConfigError& e) {
      std::string message = e.what();
      INFO("message: " << message);
      CHECK(message.rfind("job.json: ", 0) == 0);
      CHECK(message.find(c.expected) != std::string::npos);
      CHECK(message.find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("the shipped configs parse") {
  for (const char* name :
       {"fashion-mnist-2workers.json", "fashion-mnist-4workers.json", "tiny-synthetic.json"}) {
    INFO(name);
    JobSpec spec = load_job_spec(std::string(DTRAIN_SOURCE_DIR) + "/configs/" + name);
    CHECK(spec.train_json.has_value());
    CHECK(resolve_cluster(spec).ring_size() >= 2);
  }
}

TEST_CASE("a minimal job gets the documented defaults (docs/job-file.md)") {
  JobSpec spec = parse_job_spec(R"({"job": "demo", "workers": 3, "train": {"epochs": 1}})", "x");
  CHECK(spec.job == "demo");
  CHECK(spec.auto_workers == 3);
  CHECK(spec.run_dir == "runs/demo");
  CHECK(spec.restart.max_restarts == 3);
  CHECK(spec.restart.grace_seconds == 10.0);
  CHECK(spec.restart.backoff_seconds == 1.0);
  CHECK(spec.restart.max_preemptions > spec.restart.max_restarts);
  CHECK_FALSE(spec.hang_timeout_seconds.has_value());
  CHECK(spec.command.empty());
  CHECK(*spec.train_json == R"({"epochs":1})");
  CHECK(spec.remote_shell == std::vector<std::string>{"ssh"});
}

TEST_CASE("every key of the job file is read") {
  JobSpec spec = parse_job_spec(R"({
    "job": "full", "cluster": {"chief": ["a:1"], "worker": ["b:2", "[::1]:3"], "evaluator": ["c:4"]},
    "restart": {"max_restarts": 5, "max_preemptions": 9, "backoff_seconds": 0.5,
                "backoff_max_seconds": 8, "grace_seconds": 3, "startup_seconds": 4,
                "healthy_seconds": 6},
    "command": ["python3", "train.py"], "env": {"A": "1", "B_2": ""}, "run_dir": "/tmp/r",
    "hang_timeout_seconds": 2.5, "remote_shell": ["ssh", "-p", "2200"]})",
                                "x");
  CHECK(spec.cluster.ring_size() == 3);
  CHECK(spec.cluster.count(kEvaluator) == 1);
  CHECK(spec.restart.max_restarts == 5);
  CHECK(spec.restart.max_preemptions == 9);
  CHECK(spec.restart.backoff_seconds == 0.5);
  CHECK(spec.restart.backoff_max_seconds == 8);
  CHECK(spec.restart.grace_seconds == 3);
  CHECK(spec.restart.startup_seconds == 4);
  CHECK(spec.restart.healthy_seconds == 6);
  CHECK(spec.command == std::vector<std::string>{"python3", "train.py"});
  CHECK(spec.env == std::vector<std::pair<std::string, std::string>>{{"A", "1"}, {"B_2", ""}});
  CHECK(spec.run_dir == "/tmp/r");
  CHECK(*spec.hang_timeout_seconds == 2.5);
  CHECK(spec.remote_shell.size() == 3);
  CHECK_FALSE(spec.train_json.has_value());
}

TEST_CASE("recovery: in place for dtrain-worker jobs, restart for command jobs") {
  CHECK(parse_job_spec(R"({"job": "j", "workers": 2, "train": {}})", "x").recovery ==
        RecoveryMode::kInPlace);
  CHECK(parse_job_spec(R"({"job": "j", "workers": 2, "command": ["p"]})", "x").recovery ==
        RecoveryMode::kRestart);
  CHECK(parse_job_spec(R"({"job": "j", "workers": 2, "train": {}, "recovery": "restart"})", "x")
            .recovery == RecoveryMode::kRestart);
  CHECK(
      parse_job_spec(R"({"job": "j", "workers": 2, "command": ["p"], "recovery": "restart"})", "x")
          .recovery == RecoveryMode::kRestart);
  CHECK_THROWS_WITH(
      parse_job_spec(R"({"job": "j", "workers": 2, "command": ["p"], "recovery": "in_place"})",
                     "job.json"),
      Catch::StartsWith("job.json: recovery: ") && Catch::Contains("owns its state") &&
          Catch::Contains("needs dtrain-worker"));
  JobSpec restart =
      parse_job_spec(R"({"job": "j", "workers": 2, "train": {}, "recovery": "restart"})", "x");
  CHECK(parse_job_spec(job_spec_to_json(restart, resolve_cluster(restart)), "spec.json").recovery ==
        RecoveryMode::kRestart);
}

TEST_CASE("\"workers\": N resolves to N distinct free localhost ports") {
  JobSpec spec = parse_job_spec(R"({"job": "j", "workers": 6, "train": {}})", "x");
  ClusterSpec cluster = resolve_cluster(spec);
  REQUIRE(cluster.count(kWorker) == 6);
  std::set<std::string> distinct(cluster.addresses(kWorker).begin(),
                                 cluster.addresses(kWorker).end());
  CHECK(distinct.size() == 6);
  for (const auto& address : cluster.addresses(kWorker)) {
    HostPort hp = parse_host_port(address, "test");
    CHECK(hp.host == "localhost");
    CHECK(hp.port > 0);
  }
}

TEST_CASE("spec.json round-trips through the parser with ports resolved") {
  JobSpec spec = parse_job_spec(R"({"job": "j", "workers": 2, "train": {"seed": 1},
                                    "env": {"X": "y"}, "hang_timeout_seconds": 5})",
                                "x");
  ClusterSpec cluster = resolve_cluster(spec);
  JobSpec again = parse_job_spec(job_spec_to_json(spec, cluster), "spec.json");
  CHECK(again.auto_workers == 0);
  CHECK(again.cluster.addresses(kWorker) == cluster.addresses(kWorker));
  CHECK(*again.train_json == *spec.train_json);
  CHECK(again.env == spec.env);
  CHECK(*again.hang_timeout_seconds == 5);
  CHECK(again.run_dir == spec.run_dir);
}

TEST_CASE("a job file that is a device, FIFO, too big or nested too deep is refused clearly") {
  CHECK_THROWS_WITH(load_job_spec("/dev/zero"),
                    Catch::StartsWith("job file: cannot read /dev/zero") &&
                        Catch::Contains("not a regular file"));
  dtrain::testing::TempDir dir;
  std::string big = dir.path() + "/big.json";
  write_file_atomically(big, std::string(kMaxJsonFileBytes + 1, ' '));
  CHECK_THROWS_WITH(load_job_spec(big), Catch::Contains(big) && Catch::Contains("longer than"));
  std::string deep = dir.path() + "/deep.json";
  write_file_atomically(deep, "{\"job\": " + std::string(5000, '[') + std::string(5000, ']') + "}");
  CHECK_THROWS_WITH(
      load_job_spec(deep),
      Catch::StartsWith(deep + ": line 1, column ") &&
          Catch::Contains(fmt::format("nested more than {} levels deep", kMaxJsonDepth)));
}

TEST_CASE("spares: none by default, a count for in place, kept through spec.json") {
  CHECK(parse_job_spec(R"({"job": "j", "workers": 2, "train": {}})", "x").spares == 0);
  JobSpec spec = parse_job_spec(R"({"job": "j", "workers": 2, "train": {}, "spares": 2})", "x");
  CHECK(spec.spares == 2);
  CHECK(parse_job_spec(job_spec_to_json(spec, resolve_cluster(spec)), "spec.json").spares == 2);
}

TEST_CASE("elastic: min_workers read, 0 when absent, kept through spec.json") {
  CHECK(parse_job_spec(R"({"job": "j", "workers": 2, "train": {}})", "x").elastic_min_workers == 0);
  JobSpec spec = parse_job_spec(
      R"({"job": "j", "workers": 3, "train": {}, "elastic": {"min_workers": 2}})", "x");
  CHECK(spec.elastic_min_workers == 2);
  CHECK(spec.recovery == RecoveryMode::kInPlace);
  std::string printed = job_spec_to_json(spec, resolve_cluster(spec));
  CHECK(printed.find(R"("elastic":{"min_workers":2})") != std::string::npos);
  CHECK(parse_job_spec(printed, "spec.json").elastic_min_workers == 2);
  JobSpec plain = parse_job_spec(R"({"job": "j", "workers": 2, "train": {}})", "x");
  CHECK(job_spec_to_json(plain, resolve_cluster(plain)).find("elastic") == std::string::npos);
}
