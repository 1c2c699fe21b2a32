// dtrain launch across two hosts: two network namespaces with sshd each (netns_hosts.h), the
// launcher in the first, workers on the second started over ssh through `dtrain agent`. The main
// job's model and data train to success with the remote workers' lines in their logs; no
// command line anywhere carries the job's environment; SIGKILL of the launcher leaves no process
// of the job on either host; SIGKILL of a remote worker restarts the group. Skips with a WARN
// where the machine refuses namespaces or sshd.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "test/launcher/multi_host_job.h"
#include "test/support/main_job.h"
#include "test/support/netns_hosts.h"
#include "test/support/processes.h"
#include "test/support/temp_dir.h"

using namespace dtrain::testing;

TEST_CASE(
    "two hosts x two workers train the main job; remote lines reach the logs; no secrets "
    "on command lines") {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string job = write_job(dir, hosts, main_job_train(1, 25));
  std::string run = dir.path() + "/run";
  ProcessOptions options;
  options.timeout_seconds = 180;
  BackgroundProcess launcher(launch_argv(hosts, job, run), options);
  // While the job runs, no command line on either host shows its token or TF_CONFIG (taken
  // from the workers' own environments: other tests may run beside this one).
  std::vector<std::string> leaks, secrets;
  for (int i = 0; i < 60 && process_alive(launcher.pid()); ++i) {
    if (secrets.empty()) {
      for (int pid : processes_of_run(run)) {
        std::string env = read_all("/proc/" + std::to_string(pid) + "/environ");
        for (const char* name : {"DTRAIN_TOKEN=", "TF_CONFIG="}) {
          size_t at = env.find(name);
          if (at != std::string::npos)
            secrets.push_back(
                env.substr(at + std::strlen(name), env.find('\0', at) - at - std::strlen(name)));
        }
        if (!secrets.empty()) break;
      }
    }
    for (const std::string& hit : command_lines_with(secrets)) leaks.push_back(hit);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(secrets.size() == 2);  // the check above saw the running job's values
  auto r = launcher.wait(180);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  INFO((leaks.empty() ? std::string() : leaks.front()));
  CHECK(leaks.empty());
  for (int i = 2; i < 4; ++i) {  // the remote workers
    std::string log = read_all(run + "/logs/worker-" + std::to_string(i) + ".log");
    INFO(log);
    CHECK(log.find("==== dtrain: attempt 0") != std::string::npos);
    CHECK(log.find("task worker:" + std::to_string(i) + ": rank " + std::to_string(i) + " of 4") !=
          std::string::npos);
    CHECK(log.find("25/25") != std::string::npos);
    CHECK(log.find("finished") != std::string::npos);
    CHECK(log.find("\036") == std::string::npos);  // agent marker lines stay out of the logs
    // Two hosts: communication "auto" cannot share memory across them and takes the ring.
    CHECK(log.find("shared memory not used") != std::string::npos);
    CHECK(log.find("communication: TCP ring, gradient buckets") != std::string::npos);
  }
  auto logs = run_process({binary("dtrain"), "logs", run, "--worker", "3", "--raw"});
  CHECK(logs.out.find("task worker:3: rank 3 of 4") != std::string::npos);
  std::string events = read_all(run + "/events.jsonl");
  CHECK(events.find("\"remote_start\"") != std::string::npos);
  CHECK(events.find("\"restart\"") == std::string::npos);
  // The token file of the run is not readable by other users.
  CHECK(processes_of_run(run).empty());
}

TEST_CASE("SIGKILL of the launcher leaves no process of the job on any host 2 s later") {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string job = write_job(dir, hosts,
                              R"("command": [")" + binary("dtrain-test-worker") +
                                  R"(", "--grandchild", "--sleep", "300"])");
  std::string run = dir.path() + "/run";
  BackgroundProcess launcher(launch_argv(hosts, job, run));
  for (int i = 0; i < 4; ++i) {
    std::string name = "worker-" + std::to_string(i) + "-0";
    REQUIRE(wait_pid_file(run + "/pids/" + name + ".pid", 20) > 0);
    REQUIRE(wait_pid_file(run + "/pids/grandchild-" + name + ".pid", 20) > 0);
  }
  REQUIRE(processes_of_run(run).size() >= 8);  // workers and grandchildren on both hosts
  launcher.signal(SIGKILL);
  launcher.wait(10);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::vector<int> left = processes_of_run(run);
  INFO(left.size() << " process(es) of the run left, first pid " << (left.empty() ? 0 : left[0]));
  CHECK(left.empty());
}

TEST_CASE("SIGKILL of a remote worker restarts the group on both hosts, which then succeeds") {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string job = write_job(
      dir, hosts, R"("command": [")" + binary("dtrain-test-worker") + R"(", "--sleep", "2"])");
  std::string run = dir.path() + "/run";
  BackgroundProcess launcher(launch_argv(hosts, job, run));
  int remote = wait_pid_file(run + "/pids/worker-3-0.pid", 20);
  REQUIRE(remote > 0);
  ::kill(remote, SIGKILL);
  auto r = launcher.wait(60);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  std::string events = read_all(run + "/events.jsonl");
  CHECK(events.find("\"restart\"") != std::string::npos);
  CHECK(wait_pid_file(run + "/pids/worker-3-1.pid", 1) > 0);  // attempt 1 ran on host 1 too
  CHECK(read_all(run + "/logs/worker-3.log").find("==== dtrain: attempt 1") != std::string::npos);
  CHECK(processes_of_run(run).empty());
}

TEST_CASE("a cut link: the launcher names the lost host and gives up; the cut-off workers end") {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string job = write_job(
      dir, hosts, R"("command": [")" + binary("dtrain-test-worker") + R"(", "--sleep", "300"])");
  std::string run = dir.path() + "/run";
  BackgroundProcess launcher(launch_argv(hosts, job, run));
  int remote = wait_pid_file(run + "/pids/worker-3-0.pid", 20);
  REQUIRE(remote > 0);
  REQUIRE(wait_pid_file(run + "/pids/worker-2-0.pid", 20) > 0);
  auto cut = std::chrono::steady_clock::now();
  hosts.cut_link(1);
  // ssh notices in about 4 s (ServerAliveInterval 1 x 3); a restart cannot reach the host
  // (ConnectTimeout 5); the restart budget (2) runs out.
  auto r = launcher.wait(90);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("lost host " + hosts.host(1)) != std::string::npos);
  std::string events = read_all(run + "/events.jsonl");
  CHECK(events.find("\"lost_host\"") != std::string::npos);
  // Host 1's agents hear nothing more from the launcher: they stop their groups within their
  // keep-alive time (10 s) plus the 2 s teardown, counted from the cut.
  while (!processes_of_run(run).empty() &&
         std::chrono::steady_clock::now() - cut < std::chrono::seconds(15)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CHECK(processes_of_run(run).empty());
  CHECK_FALSE(process_alive(remote));
  hosts.restore_link(1);
}
