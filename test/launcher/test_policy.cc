// Exit classification (docs/design.md#exit-codes), restart budgets and back-off, line splitting,
// and what each worker is started with.
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "common/exit_codes.h"
#include "common/job_spec.h"
#include "common/tf_config.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/plan/run_preparation.h"
#include "launcher/plan/worker_env.h"
#include "launcher/process/exit_status.h"
#include "launcher/process/line_splitter.h"
#include "launcher/process/shell_quote.h"
#include "launcher/supervisor/restart_policy.h"
#include "test/support/temp_dir.h"

using namespace dtrain::launcher;

TEST_CASE("exit codes and signals are classified as docs/design.md#exit-codes says") {
  CHECK(classify(ExitStatus::exited(0)) == Outcome::kSuccess);
  CHECK(classify(ExitStatus::exited(2)) == Outcome::kConfigError);
  for (int code : {143, 42, 130, 137})
    CHECK(classify(ExitStatus::exited(code)) == Outcome::kPreempted);
  for (int sig : {SIGTERM, SIGKILL, SIGINT, SIGHUP})
    CHECK(classify(ExitStatus::killed(sig)) == Outcome::kPreempted);
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL})
    CHECK(classify(ExitStatus::killed(sig)) == Outcome::kCrashed);
  CHECK(classify(ExitStatus::exited(134)) == Outcome::kCrashed);
  CHECK(classify(ExitStatus::exited(139)) == Outcome::kCrashed);
  for (int code : {1, 3, 127, 255}) CHECK(classify(ExitStatus::exited(code)) == Outcome::kFailed);
  CHECK(classify(ExitStatus::killed(SIGUSR1)) == Outcome::kFailed);
  CHECK(describe(ExitStatus::killed(SIGSEGV)) == "killed by SIGSEGV");
  CHECK(describe(ExitStatus::exited(139)) == "exit code 139 (SIGSEGV from a shell)");
  CHECK(describe(ExitStatus::exited(3)) == "exit code 3");
  CHECK(ExitStatus::killed(SIGKILL).shell_code() == 137);
}

TEST_CASE("the exit codes have names, and SIGKILL is told from a shell's 137") {
  using namespace dtrain::common;
  CHECK(classify(ExitStatus::exited(kExitConfig)) == Outcome::kConfigError);
  CHECK(classify(ExitStatus::exited(kExitFailure)) == Outcome::kFailed);
  for (int code : {kExitPreempted, kExitTensorFlowPreempted, kExitInterrupted, kExitKilled})
    CHECK(classify(ExitStatus::exited(code)) == Outcome::kPreempted);
  CHECK(kExitKilled == kExitSignalBase + SIGKILL);
  CHECK(kExitInterrupted == kExitSignalBase + SIGINT);
  CHECK(kExitPreempted == kExitSignalBase + SIGTERM);
  CHECK(job_exit_code(ExitStatus::exited(kExitConfig)) == kExitConfig);
  CHECK(killed_by_sigkill(ExitStatus::killed(SIGKILL)));
  CHECK(killed_by_sigkill(ExitStatus::exited(kExitKilled)));
  CHECK_FALSE(killed_by_sigkill(ExitStatus::killed(SIGTERM)));
  CHECK_FALSE(killed_by_sigkill(ExitStatus::exited(kExitPreempted)));
  CHECK_FALSE(killed_by_sigkill(ExitStatus::exited(SIGKILL)));
}

TEST_CASE("success is parsed once into a rule, and spec.json spells it as the job file did") {
  using namespace dtrain::common;
  auto parse = [](const std::string& success) {
    return parse_job_spec(R"({"job": "s", "workers": 2, "command": ["x"])" + success + "}", "j");
  };
  CHECK(parse("").success == SuccessRule::kAllTasks);
  CHECK(parse(R"(, "success": "all")").success == SuccessRule::kAllTasks);
  JobSpec chief = parse(R"(, "success": "chief")");
  CHECK(chief.success == SuccessRule::kChiefOnly);
  CHECK(job_spec_to_json(chief, ClusterSpec({{"worker", {"localhost:1"}}}))
            .find(R"("success":"chief")") != std::string::npos);
  CHECK_THROWS_WITH(parse(R"(, "success": "any")"),
                    Catch::Contains(R"(success: expected "all" or "chief")"));
}

namespace {

// The request a launch makes for task at attempt, through the plan as the supervisor does.
SpawnRequest request_for(const LaunchContext& c, const dtrain::common::TaskId& task, int attempt) {
  LaunchPlan plan = plan_launch(c);
  return make_spawn_request(plan, plan.task(task), {attempt, plan.master_port});
}

// The GPU the plan hands task ("" for none).
std::string gpu_of(const LaunchContext& c, const dtrain::common::TaskId& task) {
  return plan_launch(c).task(task).gpu;
}
dtrain::common::RestartPolicy policy() {
  dtrain::common::RestartPolicy p;
  p.max_restarts = 3;
  p.max_preemptions = 2;
  p.backoff_seconds = 1;
  p.backoff_max_seconds = 3;
  p.healthy_seconds = 60;
  return p;
}
}  // namespace

TEST_CASE("failures back off exponentially with jitter, up to the cap, within the budget") {
  RestartBook book(policy(), 7);
  double expected[] = {1, 2, 3};
  for (double base : expected) {
    Decision d = book.decide({Outcome::kFailed, true, 1});
    REQUIRE(d.restart);
    CHECK(d.delay_seconds >= 0.8 * base);
    CHECK(d.delay_seconds <= 1.2 * base);
  }
  CHECK(book.restarts() == 3);
  Decision last = book.decide({Outcome::kCrashed, true, 1});
  CHECK_FALSE(last.restart);
  CHECK(last.reason.find("restart budget") != std::string::npos);
}

TEST_CASE("a replacement in place costs what a restart costs, with no back-off") {
  RestartBook book(policy(), 7);
  Decision failed = book.decide_in_place({Outcome::kFailed, true, 1});
  CHECK(failed.restart);
  CHECK(failed.delay_seconds == 0);
  CHECK(book.decide_in_place({Outcome::kPreempted, true, 1}).restart);
  CHECK(book.restarts() == 1);
  CHECK(book.preemptions() == 1);
  // A later whole-group restart backs off as the first consecutive failure: 1 s, not 2 s.
  Decision restart = book.decide({Outcome::kFailed, true, 1});
  REQUIRE(restart.restart);
  CHECK(restart.delay_seconds <= 1.2);
  CHECK(book.decide_in_place({Outcome::kCrashed, true, 1}).restart);
  Decision spent = book.decide_in_place({Outcome::kFailed, true, 1});
  CHECK_FALSE(spent.restart);
  CHECK(spent.reason.find("restart budget") != std::string::npos);
  CHECK_FALSE(book.decide_in_place({Outcome::kConfigError, true, 1}).restart);
  // The preemption budget (2 here) runs out too.
  CHECK(book.decide_in_place({Outcome::kPreempted, true, 1}).restart);
  CHECK_FALSE(book.decide_in_place({Outcome::kPreempted, true, 1}).restart);
}

TEST_CASE("a healthy run resets the back-off but not the budget") {
  RestartBook book(policy(), 1);
  book.decide({Outcome::kFailed, true, 1});
  book.decide({Outcome::kFailed, true, 1});
  Decision after_healthy = book.decide({Outcome::kFailed, true, 120});
  CHECK(after_healthy.delay_seconds <= 1.2);
  CHECK(book.restarts() == 3);
}

TEST_CASE("preemptions have their own budget and no doubling") {
  RestartBook book(policy(), 1);
  CHECK(book.decide({Outcome::kPreempted, true, 1}).restart);
  CHECK(book.decide({Outcome::kPreempted, false, 1}).delay_seconds == 1);
  CHECK(book.preemptions() == 2);
  CHECK(book.restarts() == 0);
  CHECK_FALSE(book.decide({Outcome::kPreempted, true, 1}).restart);
}

TEST_CASE("configuration errors and two silent failures in a row stop the job") {
  RestartBook config(policy(), 1);
  CHECK_FALSE(config.decide({Outcome::kConfigError, true, 1}).restart);
  // TerminateOnNaN's exit 4: the same data would give the same NaN, in place or restarted.
  CHECK(classify(ExitStatus::exited(dtrain::common::kExitNonFinite)) == Outcome::kNonFinite);
  RestartBook diverged(policy(), 1);
  Decision nan = diverged.decide({Outcome::kNonFinite, true, 1});
  CHECK_FALSE(nan.restart);
  CHECK(nan.reason.find("non-finite") != std::string::npos);
  CHECK_FALSE(diverged.decide_in_place({Outcome::kNonFinite, true, 1}).restart);
  RestartBook silent(policy(), 1);
  CHECK(silent.decide({Outcome::kFailed, false, 1}).restart);
  Decision second = silent.decide({Outcome::kFailed, false, 1});
  CHECK_FALSE(second.restart);
  CHECK(second.reason.find("configuration problem") != std::string::npos);
  RestartBook mixed(policy(), 1);
  CHECK(mixed.decide({Outcome::kFailed, false, 1}).restart);
  CHECK(mixed.decide({Outcome::kFailed, true, 1}).restart);
  CHECK(mixed.decide({Outcome::kFailed, false, 1}).restart);
}

TEST_CASE("a worker SIGKILLed twice in a row before any progress stops the job (OOM killer)") {
  dtrain::common::RestartPolicy p = policy();
  p.max_preemptions = 100;
  RestartBook book(p, 1);
  AttemptEnd oom{Outcome::kPreempted, false, 1, true};
  CHECK(book.decide(oom).restart);
  Decision second = book.decide(oom);
  CHECK_FALSE(second.restart);
  CHECK(second.reason.find("SIGKILL twice in a row") != std::string::npos);
  CHECK(second.reason.find("OOM killer") != std::string::npos);
  CHECK(book.preemptions() == 1);

  // After progress, a SIGKILL is the preemption it always was, as often as the budget allows.
  RestartBook preempted(p, 1);
  for (int i = 0; i < 10; ++i)
    CHECK(preempted.decide({Outcome::kPreempted, true, 1, true}).restart);
  CHECK(preempted.preemptions() == 10);
  // A SIGTERM preemption in between ends the run of silent SIGKILLs.
  RestartBook between(p, 1);
  CHECK(between.decide(oom).restart);
  CHECK(between.decide({Outcome::kPreempted, false, 1, false}).restart);
  CHECK(between.decide(oom).restart);
  // A silent SIGKILL then a silent failure: two silent ends in a row, still stopped.
  RestartBook then_failed(p, 1);
  CHECK(then_failed.decide(oom).restart);
  Decision failed = then_failed.decide({Outcome::kFailed, false, 1});
  CHECK_FALSE(failed.restart);
  CHECK(failed.reason.find("configuration problem") != std::string::npos);
}

TEST_CASE("two start failures in a row stop the job, and the reason says a worker never started") {
  RestartBook book(policy(), 1);
  // The supervisor may think the group ran long enough to count as progress; a start failure
  // never is, whatever its outcome (srun may end a step that never started by a signal).
  AttemptEnd never_started{Outcome::kFailed, true, 40, false, true};
  CHECK(book.decide(never_started).restart);
  Decision second = book.decide({Outcome::kPreempted, true, 40, false, true});
  CHECK_FALSE(second.restart);
  CHECK(second.reason.find("could not be started twice in a row") != std::string::npos);
  CHECK(second.reason.find("remote shell or srun") != std::string::npos);
  CHECK(book.preemptions() == 0);
  // One start failure and one silent failure: stopped, and the reason names the start failure.
  RestartBook mixed(policy(), 1);
  CHECK(mixed.decide({Outcome::kFailed, false, 1}).restart);
  Decision then = mixed.decide(never_started);
  CHECK_FALSE(then.restart);
  CHECK(then.reason.find("a worker could not be started") != std::string::npos);
}

TEST_CASE("the line splitter keeps every byte and cuts at \\n, \\r and the length cap") {
  std::vector<std::string> lines;
  LineSplitter splitter([&](std::string_view l) { lines.emplace_back(l); }, 8);
  splitter.feed("ab");
  splitter.feed("c\nde\r1/3\r");
  splitter.feed("0123456789xy");
  splitter.feed("\n");
  splitter.feed("tail");
  CHECK(splitter.has_partial());
  splitter.finish();
  std::vector<std::string> expected = {"abc\n", "de\r", "1/3\r", "01234567", "89xy\n", "tail"};
  CHECK(lines == expected);
}

TEST_CASE("the line splitter cuts a long line that arrives with its terminator in one read") {
  // Found by fuzz_line_splitter: a read holding a whole long line was handed over uncut.
  for (const std::string& partial : {std::string(), std::string("ab")}) {
    std::vector<std::string> lines;
    LineSplitter splitter([&](std::string_view l) { lines.emplace_back(l); }, 8);
    splitter.feed(partial);
    splitter.feed("0123456789abcdefgh\n");
    splitter.finish();
    std::string joined;
    for (const std::string& line : lines) {
      CHECK(line.size() <= 9);
      joined += line;
    }
    CHECK(joined == partial + "0123456789abcdefgh\n");
    CHECK(lines.size() == 3);
  }
}

TEST_CASE("each worker gets its TF_CONFIG, the DTRAIN_* variables, threads and the job's env") {
  using namespace dtrain::common;
  JobSpec spec = parse_job_spec(
      R"({"job": "envjob", "cluster": {"worker": ["localhost:1001", "localhost:1002"]},
                                    "train": {}, "env": {"EXTRA": "yes"}})",
      "x");
  LaunchContext c;
  c.spec = &spec;
  c.cluster = spec.cluster;
  c.run_dir = "/abs/run";
  c.spec_path = "/abs/run/spec.json";
  c.token = "abcd";
  c.control_address = "unix:/abs/run/control.sock";
  c.worker_program = "/opt/dtrain-worker";
  c.cwd = "/home/u";
  c.host_cores = 8;
  SpawnRequest r = request_for(c, {"worker", 1}, 3);
  auto env = [&](const std::string& name) {
    for (const auto& [k, v] : r.env)
      if (k == name) return v;
    return std::string("<unset>");
  };
  CHECK(env("TF_CONFIG") == format_tf_config(spec.cluster, {"worker", 1}));
  CHECK(env("DTRAIN_ATTEMPT") == "3");
  CHECK(env("DTRAIN_JOB") == "envjob");
  CHECK(env("DTRAIN_RUN_DIR") == "/abs/run");
  CHECK(env("DTRAIN_TOKEN") == "abcd");
  CHECK(env("DTRAIN_CONTROL") == "unix:/abs/run/control.sock");
  CHECK(env("OMP_NUM_THREADS") == "4");
  CHECK(env("EXTRA") == "yes");
  CHECK(r.argv == std::vector<std::string>{"/opt/dtrain-worker", "--config", "/abs/run/spec.json"});
  CHECK(r.cwd == "/home/u");

  c.launcher_omp_threads = "3";
  r = request_for(c, {"worker", 0}, 0);
  CHECK(env("OMP_NUM_THREADS") == "<unset>");  // the user's own setting is inherited untouched
}

TEST_CASE("workers on other hosts go through the remote shell with quoted arguments") {
  using namespace dtrain::common;
  JobSpec spec = parse_job_spec(R"({"job": "r", "cluster": {"worker": ["localhost:1", "gpu7:2222"]},
                                    "command": ["python3", "it's.py"], "remote_shell": ["ssh", "-p", "22"]})",
                                "x");
  LaunchContext c;
  c.spec = &spec;
  c.cluster = spec.cluster;
  c.cwd = "/work";
  SpawnRequest local = request_for(c, {"worker", 0}, 0);
  CHECK(local.argv == std::vector<std::string>{"python3", "it's.py"});
  c.dtrain_program = "/opt/d train/dtrain";
  SpawnRequest remote = request_for(c, {"worker", 1}, 0);
  // `ssh -p 22 -- gpu7 '/opt/d train/dtrain' agent --keepalive 10 --signal-grace 10`: nothing
  // of the job on argv; a signal to the agent gives the worker the job's grace_seconds to save;
  // "--" keeps the host from being read as an option.
  REQUIRE(remote.argv.size() == 11);
  CHECK(remote.argv[0] == "ssh");
  CHECK(remote.argv[3] == "--");
  CHECK(remote.argv[4] == "gpu7");
  CHECK(remote.argv[5] == "'/opt/d train/dtrain'");
  CHECK(remote.argv[6] == "agent");
  CHECK(remote.argv[7] == "--keepalive");
  CHECK(remote.argv[9] == "--signal-grace");
  CHECK(remote.argv[10] == "10");
  CHECK(remote.env.empty());
  CHECK(remote.agent());
  for (const std::string& arg : remote.argv) CHECK(arg.find("TF_CONFIG") == std::string::npos);
  // The agent gets argv, env (TF_CONFIG, the token) and the working folder on its stdin.
  AgentRequest sent =
      parse_agent_request(remote.agent_request.substr(0, remote.agent_request.size() - 1));
  CHECK(sent.argv == std::vector<std::string>{"python3", "it's.py"});
  CHECK(sent.cwd == "/work");
  bool has_tf_config = false;
  for (const auto& [name, value] : sent.env) has_tf_config |= name == "TF_CONFIG";
  CHECK(has_tf_config);
  CHECK_FALSE(local.agent());
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(is_local_host("localhost"));
  CHECK(is_local_host("127.0.0.1"));
  CHECK_FALSE(is_local_host("gpu7"));
  CHECK(random_token().size() == 64);
  CHECK(random_token() != random_token());
}

TEST_CASE(
    "local workers get the host's GPUs round-robin; more workers than GPUs needs gpu_sharing") {
  using namespace dtrain::common;
  JobSpec spec =
      parse_job_spec(R"({"job": "g", "cluster": {"chief": ["localhost:1"], "worker": ["localhost:2",
      "127.0.0.1:3", "far:4"]}, "command": ["x"]})",
                     "job.json");
  LaunchContext c;
  c.spec = &spec;
  c.cluster = spec.cluster;
  c.local_gpus = 0;
  CHECK(gpu_of(c, {"worker", 0}).empty());
  CHECK_NOTHROW(plan_launch(c));
  c.local_gpus = 4;
  CHECK(gpu_of(c, {"chief", 0}) == "0");
  CHECK(gpu_of(c, {"worker", 0}) == "1");
  CHECK(gpu_of(c, {"worker", 1}) == "2");
  CHECK(gpu_of(c, {"worker", 2}).empty());  // another host: its own launcher decides
  auto env_of = [&](const TaskId& t) {
    for (const auto& [k, v] : request_for(c, t, 0).env)
      if (k == "CUDA_VISIBLE_DEVICES") return v;
    return std::string("<unset>");
  };
  CHECK(env_of({"worker", 1}) == "2");
  c.local_gpus = 2;
  CHECK_THROWS_WITH(plan_launch(c), Catch::Contains("3 local tasks but 2 GPU(s)"));
  spec.gpu_sharing = true;
  CHECK_NOTHROW(plan_launch(c));
  CHECK(gpu_of(c, {"worker", 1}) == "0");
  // A launcher started with CUDA_VISIBLE_DEVICES=5,7 hands out those GPUs, not 0 and 1.
  c.gpu_names = {"5", "7"};
  CHECK(gpu_of(c, {"chief", 0}) == "5");
  CHECK(gpu_of(c, {"worker", 0}) == "7");
  CHECK(gpu_of(c, {"worker", 1}) == "5");
}

TEST_CASE("a remote dtrain-worker gets the job's text in its request; a local one reads the file") {
  using namespace dtrain::common;
  JobSpec spec = parse_job_spec(
      R"({"job": "r", "cluster": {"worker": ["localhost:1", "gpu7:2222"]}, "train": {}})", "x");
  LaunchContext c;
  c.spec = &spec;
  c.cluster = spec.cluster;
  c.spec_path = "/abs/run/spec.json";
  c.spec_text = "{\"job\": \"r\"}\n";
  c.worker_program = "/opt/dtrain-worker";
  auto text_of = [](const SpawnRequest& r) {
    std::vector<std::pair<std::string, std::string>> env = r.env;
    if (r.agent())
      env = parse_agent_request(r.agent_request.substr(0, r.agent_request.size() - 1)).env;
    for (const auto& [k, v] : env)
      if (k == "DTRAIN_CONFIG_TEXT") return v;
    return std::string("<unset>");
  };
  CHECK(text_of(request_for(c, {"worker", 1}, 0)) == c.spec_text);
  CHECK(text_of(request_for(c, {"worker", 0}, 0)) == "<unset>");
  // A job's env may not set it: the launcher owns it.
  CHECK_THROWS_WITH(parse_job_spec(R"({"job": "r", "workers": 1, "train": {},
                                       "env": {"DTRAIN_CONFIG_TEXT": "x"}})",
                                   "x"),
                    Catch::Contains("DTRAIN_CONFIG_TEXT"));
}

// Issue 46, item 1: what a launch does with a run directory's work, from its spec.json,
// state.json and checkpoint indexes alone (docs/design.md#continuing-a-finished-run). A train
// section without "epochs" trained the default one epoch.
TEST_CASE("run_start: nothing, continue, refuse, resume or fresh, from the run's records") {
  dtrain::testing::TempDir dir;
  const std::string root = dir.path() + "/run";
  std::filesystem::create_directories(root + "/model/state");
  dtrain::common::RunDir run(root);
  auto job = [&](const std::string& train) {
    return dtrain::common::parse_job_spec(
        R"({"job": "j", "workers": 1, "run_dir": ")" + root + R"(", "train": )" + train + "}",
        "job.json");
  };
  const std::string one = R"({"model": "m", "seed": 1})";
  const std::string three = R"({"model": "m", "seed": 1, "epochs": 3})";
  auto start = [&](const std::string& train) { return run_start(job(train), run, false); };
  using Kind = RunStart::Kind;
  CHECK(start(one).kind == Kind::kFresh);  // nothing recorded
  std::ofstream(root + "/spec.json") << R"({"job": "j", "train": )" << one << "}";
  std::ofstream(root + "/state.json") << R"({"status": "succeeded"})";
  CHECK(start(one).kind == Kind::kFinished);
  // No final state yet, and model/ here: an older run's, which cannot be continued.
  CHECK(start(three).kind == Kind::kRefused);
  std::ofstream(root + "/model/state/checkpoint.json")
      << R"({"latest": "ckpt-0000000010.safetensors", "all": []})";
  RunStart more = start(three);
  CHECK(more.kind == Kind::kContinue);
  CHECK(more.what.find("from epoch 1 to epoch 3") != std::string::npos);
  RunStart other = start(R"({"model": "m", "seed": 2})");
  CHECK(other.kind == Kind::kRefused);
  CHECK(other.what.find("train.seed changed") != std::string::npos);
  CHECK(run_start(job(three), run, true).kind == Kind::kFresh);  // --fresh
  std::ofstream(root + "/state.json", std::ios::trunc) << R"({"status": "stopped"})";
  std::filesystem::create_directories(root + "/backup");
  std::ofstream(root + "/backup/checkpoint.json")
      << R"({"latest": "ckpt-0000000004.safetensors", "all": []})";
  RunStart resume = start(one);
  CHECK(resume.kind == Kind::kResume);
  CHECK(resume.what.find("ckpt-0000000004.safetensors") != std::string::npos);
}

// docs/design.md#spares: "spares": N standby workers on each place of the training tasks, this
// machine and each ssh host, so a remote task is replaced by a spare where its address is.
TEST_CASE("spares are planned on each place of the training workers") {
  using namespace dtrain::common;
  JobSpec spec = parse_job_spec(
      R"({"job": "s", "cluster": {"worker": ["localhost:1", "localhost:2", "gpu7:2222",
          "gpu7:2223"]}, "spares": 2, "train": {}, "remote_shell": ["ssh"]})",
      "x");
  LaunchContext c;
  c.spec = &spec;
  c.cluster = spec.cluster;
  c.cwd = "/work";
  c.run_dir = "/work/runs/s";
  LaunchPlan plan = plan_launch(c);
  REQUIRE(plan.in_place);
  REQUIRE(plan.spares.size() == 4);
  for (int i = 0; i < 4; ++i) {
    const TaskPlan& spare = plan.spares[static_cast<size_t>(i)];
    INFO(spare.task.text());
    CHECK(spare.task.text() == "spare:" + std::to_string(i));
    CHECK_FALSE(spare.trains());
    CHECK(spare.remote() == (i >= 2));
    CHECK(spare.where == (i >= 2 ? "gpu7" : ""));
    CHECK(spare.progress_path == (i >= 2 ? std::string(kAgentProgressPath)
                                         : "/work/runs/s/progress/spare-" + std::to_string(i)));
  }
}
