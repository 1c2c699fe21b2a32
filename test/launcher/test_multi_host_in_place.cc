// Recovery in place across two hosts (docs/design.md#in-place-recovery): the main job's model on
// two network-namespace hosts with two workers each (netns_hosts.h), the second host's started
// over ssh through `dtrain agent`. A remote worker SIGKILLed mid-epoch is replaced by a new agent
// session on its host, and one SIGSTOPped is found frozen through its agent's watch events and
// replaced; the other three are the same processes at the end, at most one step is redone, and
// the final model is the undisturbed run's, bit for bit; so it is when the spare on the killed
// worker's host takes its place. A cut link is found within 10 s and
// blamed on the host that was cut. Skips with a WARN where the machine refuses namespaces or sshd.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "common/progress_record.h"
#include "test/launcher/multi_host_job.h"
#include "test/support/main_job.h"

using namespace dtrain;
using namespace dtrain::testing;

namespace {

constexpr int kSteps = 40;  ///< per epoch; 2 epochs, epoch checkpoints only

// Each training process of the run: the local workers' pids from state.json, the remote
// workers' pids on their host from the latest remote_start event of each.
std::map<std::string, int> worker_pids(const std::string& run) {
  std::map<std::string, int> out;
  common::JsonDocument state =
      common::JsonDocument::parse(read_all(run + "/state.json"), "state.json");
  for (const common::JsonNode& w : state.root().at("workers").as_array())
    out[w.at("task").as_string()] = static_cast<int>(w.at("pid").as_int(0, 1 << 30));
  for (const common::JsonDocument& e : events(run, "remote_start"))
    out[e.root().at("task").as_string()] =
        static_cast<int>(e.root().at("remote_pid").as_int(0, 1 << 30));
  return out;
}

}  // namespace

TEST_CASE("in place over ssh: a remote worker SIGKILLed or SIGSTOPped is replaced on its host") {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string job = write_job(dir, hosts, main_job_train(2, kSteps));
  std::string expected = undisturbed_model(dir, hosts, job);
  ProcessOptions options;
  options.timeout_seconds = 240;

  for (int fault : {SIGKILL, SIGSTOP}) {
    INFO("worker:3 gets signal " << fault);
    std::string run = dir.path() + "/run-" + std::to_string(fault);
    BackgroundProcess launcher(launch_argv(hosts, job, run), options);
    REQUIRE(wait_for_step(run, kSteps + 10, launcher.pid(), 120));  // inside epoch 2
    std::map<std::string, int> before = worker_pids(run);
    REQUIRE(before.size() == 4);
    ::kill(before.at("worker:3"), fault);
    auto r = launcher.wait(240);
    INFO(r.out << r.err);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 0);
    std::map<std::string, int> after = worker_pids(run);
    for (const char* task : {"worker:0", "worker:1", "worker:2"})
      CHECK(after.at(task) == before.at(task));
    CHECK(after.at("worker:3") != before.at("worker:3"));
    std::vector<common::JsonDocument> recovered = events(run, "recovered");
    REQUIRE(recovered.size() == 1);
    CHECK(recovered[0].root().at("path").as_string() == "in_place");
    CHECK(recovered[0].root().at("steps_redone").as_int(0, 1 << 30) <= 1);
    CHECK(events(run, "restart").empty());
    if (fault == SIGSTOP) {
      std::vector<common::JsonDocument> frozen = events(run, "frozen");
      REQUIRE(frozen.size() == 1);
      CHECK(frozen[0].root().at("task").as_string() == "worker:3");
      CHECK(frozen[0].root().at("place").as_string() == "host " + hosts.host(1));
      CHECK(frozen[0].root().at("why").as_string().rfind("stopped", 0) == 0);
    }
    CHECK(read_all(run + "/model/model.safetensors") == expected);
    CHECK(processes_of_run(run).empty());
  }

  // With a spare on each host (docs/design.md#spares): host 1's spare, warm and waiting there,
  // takes the SIGKILLed remote worker's place (no process start), and the model is the same.
  std::string text = read_all(job);
  const std::string train = "\"train\":";
  REQUIRE(text.find(train) != std::string::npos);
  text.replace(text.find(train), 0, "\"spares\": 1, ");
  std::string spares_job = dir.path() + "/job-spares.json";
  std::ofstream(spares_job) << text;
  std::string run = dir.path() + "/run-spare";
  BackgroundProcess launcher(launch_argv(hosts, spares_job, run), options);
  REQUIRE(wait_for_step(run, kSteps + 10, launcher.pid(), 120));
  // spare:0 is host 0's, spare:1 host 1's.
  for (int waited = 0;
       read_all(run + "/logs/spare-1.log").find("waiting to be promoted") == std::string::npos;
       ++waited) {
    INFO(read_all(run + "/logs/spare-1.log"));
    REQUIRE(waited < 600);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::map<std::string, int> before = worker_pids(run);
  ::kill(before.at("worker:3"), SIGKILL);
  auto r = launcher.wait(240);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  std::vector<common::JsonDocument> promoted = events(run, "promoted");
  REQUIRE(promoted.size() == 1);
  CHECK(promoted[0].root().at("spare").as_string() == "spare:1");
  CHECK(promoted[0].root().at("task").as_string() == "worker:3");
  std::vector<common::JsonDocument> recovered = events(run, "recovered");
  REQUIRE(recovered.size() == 1);
  CHECK(recovered[0].root().at("path").as_string() == "in_place");
  CHECK(read_all(run + "/model/model.safetensors") == expected);
  CHECK(processes_of_run(run).empty());
}

// No ssh option tells the launcher here: host 1's agents go silent, the group stalls, and the
// freeze watch blames a worker of host 1 (or ssh's own keep-alive ends the session first and
// the launcher names the lost host). Either way host 1, within 10 s of the cut.
TEST_CASE("in place over ssh: a cut link is found within 10 s and blamed on its host") {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string job = write_job(dir, hosts, main_job_train(50, 200));
  std::string run = dir.path() + "/run";
  ProcessOptions options;
  options.timeout_seconds = 180;
  BackgroundProcess launcher(launch_argv(hosts, job, run), options);
  REQUIRE(wait_for_step(run, 20, launcher.pid(), 120));
  auto cut = std::chrono::steady_clock::now();
  hosts.cut_link(1);
  std::string blamed;
  double found_after = -1;
  while (blamed.empty() && std::chrono::steady_clock::now() - cut < std::chrono::seconds(30)) {
    for (const common::JsonDocument& e : events(run, "frozen"))
      if (auto place = e.root().find("place")) blamed = place->as_string();
    for (const common::JsonDocument& e : events(run, "lost_host"))
      blamed = "host " + e.root().at("host").as_string();
    found_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO("blamed \"" << blamed << "\" " << found_after << " s after the cut");
  CHECK(blamed == "host " + hosts.host(1));
  CHECK(found_after < 10);
  // Host 1 stays unreachable: its replacements cannot start, and the job ends, naming it.
  auto r = launcher.wait(180);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find(hosts.host(1)) != std::string::npos);
  auto ended = std::chrono::steady_clock::now();
  while (!processes_of_run(run).empty() &&
         std::chrono::steady_clock::now() - ended < std::chrono::seconds(15))
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(processes_of_run(run).empty());
  hosts.restore_link(1);
}
