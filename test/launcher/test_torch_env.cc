// torchrun's variables: ranks in TF_CONFIG's ring order, local ranks and host numbers by where
// tasks run (this machine, other hosts, Slurm nodes), MASTER_ADDR/PORT, TORCHELASTIC_*, the
// evaluator left out, and the job's env winning.
#include <catch2/catch.hpp>
#include <map>
#include <optional>

#include "common/job_spec.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/plan/torch_env.h"
#include "launcher/plan/worker_env.h"

using namespace dtrain;
using Env = std::map<std::string, std::string>;

namespace {

struct Context {
  explicit Context(const std::string& json) : spec(common::parse_job_spec(json, "job.json")) {
    c.spec = &spec;
    c.cluster = spec.cluster;
    c.run_dir = "/runs/t";
    c.token = "feed";
    c.worker_program = "/opt/dtrain-worker";
  }
  launcher::LaunchPlan plan() const { return launcher::plan_launch(c); }
  // The env the task starts with, from the agent request when it goes to another host.
  // attempt: of a launch that began at attempt 0, so its restarts (TORCHELASTIC_RESTART_COUNT)
  // are as many.
  Env env_of(const common::TaskId& task, int attempt = 0) const {
    launcher::LaunchPlan p = plan();
    launcher::AttemptParams params{attempt, master_port};
    params.restarts = attempt;
    launcher::SpawnRequest r = launcher::make_spawn_request(p, p.task(task), params);
    std::vector<std::pair<std::string, std::string>> env = r.env;
    if (r.agent()) {
      env =
          launcher::parse_agent_request(r.agent_request.substr(0, r.agent_request.size() - 1)).env;
    }
    Env out;
    for (const auto& [name, value] : env) {
      CHECK(out.count(name) == 0);  // no variable twice
      out[name] = value;
    }
    return out;
  }
  common::JobSpec spec;
  launcher::LaunchContext c;
  int master_port = 29500;  ///< MASTER_PORT of the attempt
};

}  // namespace

TEST_CASE("two local workers: ranks, one host, the chief's address and the attempt") {
  Context t(R"({"job": "ddp", "cluster": {"worker": ["localhost:2001", "127.0.0.1:2002"]},
               "restart": {"max_restarts": 5}, "command": ["python3", "train.py"]})");
  for (int i : {0, 1}) {
    Env env = t.env_of({"worker", i}, 3);
    INFO("worker " << i);
    CHECK(env.at("RANK") == std::to_string(i));
    CHECK(env.at("LOCAL_RANK") == std::to_string(i));  // localhost and 127.0.0.1: one machine
    CHECK(env.at("WORLD_SIZE") == "2");
    CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(env.at("GROUP_RANK") == "0");
    CHECK(env.at("GROUP_WORLD_SIZE") == "1");
    CHECK(env.at("ROLE_RANK") == env.at("RANK"));
    CHECK(env.at("ROLE_WORLD_SIZE") == "2");
    CHECK(env.at("ROLE_NAME") == "default");
    CHECK(env.at("MASTER_ADDR") == "localhost");
    CHECK(env.at("MASTER_PORT") == "29500");
    CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "3");
    CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "5");
    CHECK(env.at("TORCHELASTIC_RUN_ID") == "ddp");
    CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
    CHECK(env.at("DTRAIN_ATTEMPT") == "3");  // beside TF_CONFIG and DTRAIN_*, not instead
  }
}

TEST_CASE("chief and workers on two hosts: RANK follows TF_CONFIG, hosts are numbered in order") {
  Context t(R"({"job": "two", "cluster": {"chief": ["hosta:2000"],
      "worker": ["hosta:2001", "hostb:2000", "HostB:2005"], "evaluator": ["hostc:1"]},
      "command": ["python3", "train.py"]})");
  struct Want {
    common::TaskId task;
    const char *rank, *local_rank, *local_size, *group_rank;
  };
  for (const Want& w :
       {Want{{"chief", 0}, "0", "0", "2", "0"}, Want{{"worker", 0}, "1", "1", "2", "0"},
        Want{{"worker", 1}, "2", "0", "2", "1"}, Want{{"worker", 2}, "3", "1", "2", "1"}}) {
    INFO(w.task.text());
    Env env = t.env_of(w.task);
    CHECK(env.at("RANK") == w.rank);
    CHECK(env.at("LOCAL_RANK") == w.local_rank);
    CHECK(env.at("LOCAL_WORLD_SIZE") == w.local_size);
    CHECK(env.at("GROUP_RANK") == w.group_rank);
    CHECK(env.at("GROUP_WORLD_SIZE") == "2");
    CHECK(env.at("WORLD_SIZE") == "4");
    CHECK(env.at("MASTER_ADDR") == "hosta");
  }
  Env evaluator = t.env_of({"evaluator", 0});
  CHECK(evaluator.count("TF_CONFIG") == 1);
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    CHECK(evaluator.count(name) == 0);  // not a member of the process group
}

TEST_CASE("MASTER_PORT: the job's, else free and no task's here, else above the chief's there") {
  Context local(R"({"job": "p", "cluster": {"worker": ["localhost:2001", "localhost:2002"]},
                   "train": {}})");
  int picked = local.plan().master_port;
  CHECK(picked != 2001);
  CHECK(picked != 2002);
  CHECK(picked > 0);
  CHECK(local.plan().master_local);

  Context remote(R"({"job": "p", "cluster": {"worker": ["far:3000", "far:3001", "near:3002"]},
                    "train": {}})");
  CHECK_FALSE(remote.plan().master_local);
  CHECK(remote.plan().master_port == 3003);  // 3001 and 3002 are tasks' ports

  Context chosen(R"({"job": "p", "workers": 2, "master_port": 41000, "train": {}})");
  chosen.c.cluster = common::resolve_cluster(chosen.spec);
  CHECK(chosen.plan().master_port == 41000);
  CHECK(common::job_spec_to_json(chosen.spec, chosen.c.cluster).find("\"master_port\":41000") !=
        std::string::npos);

  // Nothing to pick where the job's env sets MASTER_PORT (its value is used, once), and none
  // left above a remote chief's port is no error: the variable is left out with a warning.
  Context own(R"({"job": "p", "cluster": {"worker": ["far:65535", "near:3000"]},
                 "env": {"MASTER_PORT": "1234"}, "train": {}})");
  CHECK(own.plan().master_port == 0);
  own.master_port = 0;
  CHECK(own.env_of({"worker", 1}).at("MASTER_PORT") == "1234");
  Context full(R"({"job": "p", "cluster": {"worker": ["far:65535", "near:3000"]}, "train": {}})");
  CHECK(full.plan().master_port == 0);
  full.master_port = 0;
  Env without = full.env_of({"worker", 1});
  CHECK(without.count("MASTER_PORT") == 0);
  CHECK(without.at("MASTER_ADDR") == "far");

  auto refused = [](const std::string& port) {
    return common::parse_job_spec(
        R"({"job": "p", "workers": 1, "train": {}, "master_port": )" + port + "}", "job.json");
  };
  CHECK_THROWS_WITH(refused("0"), Catch::Contains("master_port"));
  CHECK_THROWS_WITH(refused("65536"), Catch::Contains("master_port"));
  CHECK_THROWS_WITH(refused("\"29500\""), Catch::Contains("master_port"));
}

TEST_CASE("the job's env overrides torchrun's variables, once") {
  Context t(R"({"job": "o", "cluster": {"worker": ["localhost:2001"]},
               "env": {"MASTER_ADDR": "10.1.2.3", "TORCHELASTIC_RUN_ID": "mine"}, "train": {}})");
  Env env = t.env_of({"worker", 0});
  CHECK(env.at("MASTER_ADDR") == "10.1.2.3");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "mine");
  CHECK(env.at("RANK") == "0");
}
