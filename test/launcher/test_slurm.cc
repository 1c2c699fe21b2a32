// The pure parts of `"cluster": "slurm"`: Slurm's host lists and per-node counts, node addresses
// from scontrol, the allocation read from SLURM_* variables (a fake environment and scontrol
// here; test_slurm_launch runs the real ones), the srun command line, the sbatch script, and the
// spawn request that keeps secrets off argv. The real cluster is test_slurm_launch.cc.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "common/errors.h"
#include "common/job_spec.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/placement/slurm.h"
#include "launcher/plan/torch_env.h"
#include "launcher/plan/worker_env.h"

using dtrain::common::ConfigError;
using dtrain::common::JobSpec;
using dtrain::common::parse_job_spec;
using dtrain::launcher::expand_hostlist;
using dtrain::launcher::parse_per_node_counts;
using dtrain::launcher::SlurmAllocation;

namespace {

using Strings = std::vector<std::string>;

JobSpec slurm_job(const std::string& slurm = "{}") {
  return parse_job_spec(
      R"({"job": "mnist", "cluster": "slurm", "train": {}, "restart": {"grace_seconds": 25},
          "slurm": )" +
          slurm + "}",
      "job.json");
}

const std::map<std::string, std::string> kTwoNodes = {
    {"SLURM_JOB_ID", "4242"},
    {"SLURM_JOB_NODELIST", "n[1-2]"},
    {"SLURM_TASKS_PER_NODE", "2(x2)"},
    {"SLURM_JOB_CPUS_PER_NODE", "4(x2)"},
};

constexpr const char* kScontrol =
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=4 CPUTot=4 NodeAddr=127.0.0.1 "
    "NodeHostName=box Version=22.05.8 OS=Linux 6.1.0 #1 SMP\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=4 CPUTot=4 NodeAddr=127.0.0.1 "
    "NodeHostName=box Version=22.05.8 OS=Linux 6.1.0 #1 SMP\n";

SlurmAllocation allocation_from(const JobSpec& spec, std::map<std::string, std::string> env,
                                Strings* scontrol_argv = nullptr,
                                std::string scontrol_out = kScontrol) {
  return dtrain::launcher::read_slurm_allocation(
      spec,
      [&env](const char* name) -> std::optional<std::string> {
        auto found = env.find(name);
        return found == env.end() ? std::nullopt : std::optional<std::string>(found->second);
      },
      [&](const Strings& argv) {
        if (scontrol_argv) *scontrol_argv = argv;
        return scontrol_out;
      });
}

}  // namespace

TEST_CASE("slurm: host lists expand as Slurm writes them", "[slurm]") {
  CHECK(expand_hostlist("n1", "x") == Strings{"n1"});
  CHECK(expand_hostlist("n[1-3]", "x") == Strings{"n1", "n2", "n3"});
  CHECK(expand_hostlist("gpu[08-10,12],login", "x") ==
        Strings{"gpu08", "gpu09", "gpu10", "gpu12", "login"});
  CHECK(expand_hostlist("rack[1-2]-n[1-2]", "x") ==
        Strings{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(expand_hostlist("a[1]x,b", "x") == Strings{"a1x", "b"});
  for (const char* bad : {"n[1-", "n1]", "n[3-1]", "n[a-b]", "n[1-2", ",n1", "n[]", "n[1--2]"}) {
    INFO(bad);
    CHECK_THROWS_AS(expand_hostlist(bad, "SLURM_JOB_NODELIST"), ConfigError);
  }
  CHECK_THROWS_WITH(expand_hostlist("n[1-999999]", "SLURM_JOB_NODELIST"),
                    Catch::Contains("SLURM_JOB_NODELIST"));
}

TEST_CASE("slurm: random and hostile host lists and counts are parsed or refused, never crash",
          "[slurm]") {
  std::mt19937 random(12345);
  const std::string alphabet = "n01-9[],x()";
  for (int i = 0; i < 20000; ++i) {
    std::string text(random() % 40, ' ');
    for (char& c : text) c = alphabet[random() % alphabet.size()];
    try {
      std::vector<std::string> hosts = expand_hostlist(text, "SLURM_JOB_NODELIST");
      CHECK(hosts.size() <= 65536);
    } catch (const ConfigError&) {
    }
    try {
      parse_per_node_counts(text, 3, "SLURM_TASKS_PER_NODE");
    } catch (const ConfigError&) {
    }
  }
  std::string deep(100000, '[');
  CHECK_THROWS_AS(expand_hostlist(deep, "x"), ConfigError);
  std::string groups = "n";
  for (int i = 0; i < 100000; ++i) groups += "[1]";  // 100000 nested expansions if unbounded
  CHECK_THROWS_WITH(expand_hostlist(groups, "x"), Catch::Contains("bracket groups"));
  CHECK(expand_hostlist("a[1]b[2]c[3]d[4]e[5]", "x") == Strings{"a1b2c3d4e5"});
  CHECK_THROWS_AS(expand_hostlist("n[1-65536],m[1-2]", "x"), ConfigError);  // too many hosts
  CHECK_THROWS_AS(parse_per_node_counts("1(x999999999)", 2, "T"), ConfigError);
}

TEST_CASE("slurm: per-node counts expand N(xM)", "[slurm]") {
  CHECK(parse_per_node_counts("2(x3),1", 4, "T") == std::vector<int>{2, 2, 2, 1});
  CHECK(parse_per_node_counts("4", 1, "T") == std::vector<int>{4});
  CHECK_THROWS_WITH(parse_per_node_counts("2(x3)", 2, "SLURM_TASKS_PER_NODE"),
                    Catch::Contains("SLURM_TASKS_PER_NODE") && Catch::Contains("2 node"));
  for (const char* bad : {"", "x", "2(x", "2(x3", "(x2)", "2(y3)", "-1"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_per_node_counts(bad, 1, "T"), ConfigError);
  }
}

TEST_CASE("slurm: node addresses come from scontrol's NodeAddr", "[slurm]") {
  auto addresses = dtrain::launcher::parse_node_addresses(std::string(kScontrol) +
                                                          "NodeName=n3 Arch=x86_64 State=IDLE\n\n");
  CHECK(addresses.at("n1") == "127.0.0.1");
  CHECK(addresses.at("n3") == "n3");  // no NodeAddr: the name
  CHECK(addresses.size() == 3);
}

TEST_CASE("slurm: a drained, down or failing node is leaving; an allocated one is not", "[slurm]") {
  using dtrain::launcher::node_leaving_state;
  auto node = [](const std::string& state) {
    return "NodeName=n1 Arch=x86_64 State=" + state + " Reason=maintenance [root@t]\n" +
           "NodeName=n2 State=IDLE+DRAIN\n";
  };
  for (const char* usable : {"IDLE", "MIXED", "ALLOCATED", "MIXED+COMPLETING", "IDLE+PLANNED"}) {
    INFO(usable);
    CHECK(node_leaving_state(node(usable), "n1").empty());
  }
  for (const char* leaving :
       {"MIXED+DRAIN", "ALLOCATED+DRAIN", "DOWN", "DOWN*", "ALLOCATED*", "IDLE+FAIL",
        "MIXED+REBOOT_REQUESTED", "IDLE+POWERING_DOWN", "IDLE~", "DOWN+DRAIN+NOT_RESPONDING"}) {
    INFO(leaving);
    CHECK(node_leaving_state(node(leaving), "n1") == leaving);
  }
  CHECK(node_leaving_state(node("MIXED"), "n2") == "IDLE+DRAIN");  // its own line
  CHECK(node_leaving_state(node("MIXED"), "n3") == "not listed");
  CHECK(node_leaving_state("", "n1") == "not listed");
}

TEST_CASE("slurm: the allocation's tasks become the workers, ports distinct per task", "[slurm]") {
  Strings scontrol;
  SlurmAllocation a = allocation_from(slurm_job(R"({"port_base": 30000})"), kTwoNodes, &scontrol);
  CHECK(scontrol == Strings{"scontrol", "-o", "show", "node", "n[1-2]"});
  CHECK(a.job_id == "4242");
  REQUIRE(a.tasks.size() == 4);
  CHECK(a.tasks[0].node == "n1");
  CHECK(a.tasks[1].node == "n1");
  CHECK(a.tasks[2].node == "n2");
  CHECK(a.tasks[3].address == "127.0.0.1:30003");  // both nodes at one address: ports differ
  CHECK(a.tasks[0].cpus == 2);                     // 4 CPUs per node, 2 tasks each
  CHECK(a.tasks[0].gpus == 0);
  CHECK(
      a.cluster().to_python_json() ==
      R"({"worker": ["127.0.0.1:30000", "127.0.0.1:30001", "127.0.0.1:30002", "127.0.0.1:30003"]})");

  SECTION("the default port base follows the job id and stays below the ephemeral range") {
    SlurmAllocation d = allocation_from(slurm_job(), kTwoNodes);
    int base = dtrain::launcher::default_port_base("4242");
    CHECK(d.tasks[0].address == "127.0.0.1:" + std::to_string(base));
    CHECK(base != dtrain::launcher::default_port_base("4243"));
    for (int id = 0; id < 1000; ++id) {
      int b = dtrain::launcher::default_port_base(std::to_string(id));
      CHECK((b >= 20000 && b + 63 < 32768));
    }
  }
  SECTION("GPUs per task as SlurmClusterResolver counts them; CPUs per task when asked") {
    auto env = kTwoNodes;
    env["SLURM_GPUS_ON_NODE"] = "4";
    env["SLURM_CPUS_PER_TASK"] = "3";
    SlurmAllocation g = allocation_from(slurm_job(), env);
    CHECK(g.tasks[0].gpus == 2);
    CHECK(g.tasks[0].cpus == 3);
    env["SLURM_GPUS_PER_TASK"] = "1";
    CHECK(allocation_from(slurm_job(), env).tasks[3].gpus == 1);
  }
  SECTION("IPv6 node addresses are bracketed") {
    SlurmAllocation v6 =
        allocation_from(slurm_job(R"({"port_base": 30000})"), kTwoNodes, nullptr,
                        "NodeName=n1 NodeAddr=fd00::1\nNodeName=n2 NodeAddr=fd00::2\n");
    CHECK(v6.tasks[2].address == "[fd00::2]:30002");
  }
}

TEST_CASE("slurm: outside an allocation, or with a broken one, a ConfigError says which",
          "[slurm]") {
  CHECK_THROWS_WITH(allocation_from(slurm_job(), {}),
                    Catch::Contains("SLURM_JOB_ID is not set") && Catch::Contains("sbatch"));
  auto env = kTwoNodes;
  env["SLURM_TASKS_PER_NODE"] = "2";
  CHECK_THROWS_WITH(allocation_from(slurm_job(), env), Catch::Contains("SLURM_TASKS_PER_NODE"));
  CHECK_THROWS_WITH(allocation_from(slurm_job(), kTwoNodes, nullptr, "NodeName=n1 NodeAddr=a\n"),
                    Catch::Contains("did not list node n2"));
  CHECK_THROWS_WITH(allocation_from(slurm_job(R"({"port_base": 65534})"), kTwoNodes),
                    Catch::Contains("65535"));
}

TEST_CASE("slurm: the job file's cluster \"slurm\" and slurm object", "[slurm]") {
  JobSpec spec = slurm_job(
      R"({"nodes": 2, "tasks_per_node": 2, "time": "01:00:00", "partition": "gpu",
          "gpus_per_task": 1, "cpus_per_task": 4, "signal_lead_seconds": 90,
          "srun": ["srun", "--mem-per-cpu=2G"], "sbatch": ["--account=ml"]})");
  CHECK(spec.slurm);
  CHECK(spec.cluster.jobs().empty());
  CHECK(spec.slurm_options.nodes == 2);
  CHECK(spec.slurm_options.srun == Strings{"srun", "--mem-per-cpu=2G"});
  CHECK(spec.slurm_options.signal_lead_seconds == 90);
  auto bad = [](const std::string& text) { return parse_job_spec(text, "job.json"); };
  CHECK_THROWS_WITH(bad(R"({"job": "j", "cluster": "yarn", "train": {}})"),
                    Catch::Contains("job.json: cluster") && Catch::Contains("\"slurm\""));
  CHECK_THROWS_WITH(bad(R"({"job": "j", "workers": 2, "slurm": {}, "train": {}})"),
                    Catch::Contains("slurm") && Catch::Contains("only for"));
  CHECK_THROWS_WITH(bad(R"({"job": "j", "cluster": "slurm", "slurm": {"nodez": 1}, "train": {}})"),
                    Catch::Contains("nodez"));
  CHECK_THROWS_WITH(bad(R"({"job": "j", "cluster": "slurm", "slurm": {"time": "1\n#SBATCH x"},
                         "train": {}})"),
                    Catch::Contains("slurm.time") && Catch::Contains("one line"));
}

TEST_CASE("slurm: each worker is one srun step running dtrain agent; secrets stay off argv",
          "[slurm]") {
  JobSpec spec = slurm_job(R"({"port_base": 30000})");
  SlurmAllocation a = allocation_from(spec, kTwoNodes);
  dtrain::launcher::LaunchContext c;
  c.spec = &spec;
  c.slurm = a;
  c.cluster = a.cluster();
  c.run_dir = "/runs/mnist";
  c.spec_path = "/runs/mnist/spec.json";
  c.token = "f00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeed";
  c.control_address = "unix:/runs/mnist/control.sock";
  c.worker_program = "/opt/dtrain/bin/dtrain-worker";
  c.dtrain_program = "/opt/dtrain/bin/dtrain";
  c.cwd = "/home/me";
  c.host_cores = 64;
  dtrain::launcher::LaunchPlan plan = dtrain::launcher::plan_launch(c);
  CHECK(plan.master_port == 30004);  // above the chief's 30000 and every task's port
  dtrain::common::TaskId task{"worker", 2};
  // A Slurm step even though 127.0.0.1 is this machine.
  CHECK(plan.task(task).placement == dtrain::launcher::Placement::kSlurmStep);
  dtrain::launcher::SpawnRequest r =
      dtrain::launcher::make_spawn_request(plan, plan.task(task), {3, plan.master_port});
  CHECK(r.agent());
  CHECK(r.env.empty());
  CHECK(r.argv == Strings{"srun", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--exact",
                          "--cpus-per-task=2", "--job-name=mnist-worker-2", "--quiet",
                          "--kill-on-bad-exit=1", "/opt/dtrain/bin/dtrain", "agent", "--keepalive",
                          "10", "--signal-grace", "25"});
  for (const std::string& arg : r.argv) CHECK(arg.find(c.token) == std::string::npos);
  dtrain::launcher::AgentRequest sent =
      dtrain::launcher::parse_agent_request(r.agent_request.substr(0, r.agent_request.size() - 1));
  std::map<std::string, std::string> env(sent.env.begin(), sent.env.end());
  CHECK(env.at("DTRAIN_TOKEN") == c.token);
  CHECK(env.at("OMP_NUM_THREADS") == "2");  // the step's CPUs, not the host's cores
  CHECK(env.at("DTRAIN_ATTEMPT") == "3");
  CHECK(env.at("TF_CONFIG").find(R"("task": {"type": "worker", "index": 2})") != std::string::npos);
  CHECK(env.count("CUDA_VISIBLE_DEVICES") == 0);  // Slurm hands out the step's GPUs
  // torchrun's view: hosts are nodes (both at 127.0.0.1 here), numbered in rank order.
  CHECK(env.at("RANK") == "2");
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
  CHECK(env.at("MASTER_PORT") == "30004");
  CHECK(sent.argv == Strings{"/opt/dtrain/bin/dtrain-worker", "--config", "/runs/mnist/spec.json"});

  SECTION("a task with GPUs asks srun for them") {
    c.slurm->tasks[2].gpus = 2;
    dtrain::launcher::LaunchPlan gpus = dtrain::launcher::plan_launch(c);
    Strings argv = dtrain::launcher::make_spawn_request(gpus, gpus.task(task), {0, 0}).argv;
    CHECK(std::find(argv.begin(), argv.end(), "--gres=gpu:2") != argv.end());
  }
}

// An elastic command job's probe of a node left (docs/design.md#elastic-membership): the task's
// own step options, running `true` instead of dtrain agent.
TEST_CASE("slurm: a probe of a node is the task's srun step running `true`", "[slurm]") {
  JobSpec spec = parse_job_spec(
      R"({"job": "mnist", "cluster": "slurm", "command": ["python3", "train.py"],
          "slurm": {"srun": ["srun", "--mpi=none"]}})",
      "job.json");
  dtrain::launcher::LaunchContext c;
  c.spec = &spec;
  c.slurm = allocation_from(spec, kTwoNodes);
  c.cluster = c.slurm->cluster();
  c.run_dir = "/runs/mnist";
  c.cwd = "/home/me";
  c.token = "f00dfeed";
  dtrain::launcher::LaunchPlan plan = dtrain::launcher::plan_launch(c);
  dtrain::launcher::SpawnRequest r =
      dtrain::launcher::make_probe_request(plan, plan.task({"worker", 3}));
  CHECK(r.argv == Strings{"srun", "--mpi=none", "--nodes=1", "--ntasks=1", "--nodelist=n2",
                          "--exact", "--cpus-per-task=2", "--job-name=mnist-worker-3", "--quiet",
                          "--kill-on-bad-exit=1", "true"});
  CHECK_FALSE(r.agent());
  CHECK(r.env.empty());
  CHECK(r.cwd == "/home/me");
}

TEST_CASE("slurm: slurm-script writes a requeueing sbatch script", "[slurm]") {
  JobSpec spec = slurm_job(R"({"nodes": 2, "tasks_per_node": 2, "time": "02:00:00",
                              "sbatch": ["--account=ml"]})");
  std::string script =
      dtrain::launcher::slurm_script(spec, "/home/me/job's.json", "/opt/dtrain", "/home/me");
  CHECK(script.rfind("#!/bin/bash\n", 0) == 0);
  for (const char* line :
       {"#SBATCH --job-name=mnist\n", "#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=2\n",
        "#SBATCH --time=02:00:00\n", "#SBATCH --requeue\n", "#SBATCH --signal=TERM@85\n",
        "#SBATCH --open-mode=append\n", "#SBATCH --chdir=/home/me\n", "#SBATCH --account=ml\n",
        "'/opt/dtrain' launch '/home/me/job'\\''s.json'\n", "scontrol requeue \"$SLURM_JOB_ID\"",
        "if [ \"$code\" -eq 143 ] && [ -z \"${cancelled:-}\" ]", "trap 'cancelled=1;"}) {
    INFO(line);
    CHECK(script.find(line) != std::string::npos);
  }
  CHECK(script.find("--gpus-per-task") == std::string::npos);
  CHECK(script.find("--partition") == std::string::npos);
}
