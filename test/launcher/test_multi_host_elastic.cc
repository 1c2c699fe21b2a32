// Elastic membership across two hosts (docs/design.md#elastic-membership): the main job's model on
// two network-namespace hosts with two workers each (netns_hosts.h), "elastic": {"min_workers":
// 2} and a host discovery program (a file's list). In epoch 1 the list drops the second host:
// its workers leave, and come back when the list names it again. In epoch 2 the second host's
// link is cut: the launcher finds it, and the first host's two workers train on, holding the
// missing workers' virtual shards. The link comes back: the second host's workers join again
// and the group is four. The final model is the undisturbed run's, bit for bit, and the ledger
// shows every example of each epoch used once. The same shrink and growth with a small ResNet
// (batch normalization, whose moving statistics are taken per virtual shard; a random flip drawn
// per shard) ends with its undisturbed run's model too. Each growth is awaited with worker 0
// stopped, so that order, not the machine's speed, decides it. Skips with a WARN where the
// machine refuses namespaces or sshd.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "common/progress_record.h"
#include "test/launcher/multi_host_job.h"
#include "test/support/language_model_job.h"
#include "test/support/main_job.h"

using namespace dtrain;
using namespace dtrain::testing;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kEpochs = 2;
constexpr int kSteps = 40;  ///< per epoch
constexpr int kBatch = 64;  ///< per worker (main_job_train's)

// A guard against a hang, not a time limit: far above the seconds any wait here takes.
constexpr double kGuardSeconds = 120;

// The kinds of run's events, in the order events.jsonl has them.
std::vector<std::string> event_kinds(const std::string& run) {
  std::vector<std::string> kinds;
  std::ifstream in(run + "/events.jsonl");
  for (std::string line; std::getline(in, line);)
    kinds.push_back(
        common::JsonDocument::parse(line, "events.jsonl").root().at("event").as_string());
  return kinds;
}

// Indexes in run's events of those of kind, in order.
std::vector<size_t> event_indexes(const std::string& run, const std::string& kind) {
  std::vector<std::string> kinds = event_kinds(run);
  std::vector<size_t> at;
  for (size_t i = 0; i < kinds.size(); ++i)
    if (kinds[i] == kind) at.push_back(i);
  return at;
}

// Waits until there are `count` events of kind; false when the guard passed or the launcher
// ended first.
bool wait_for_event(const std::string& run, const std::string& kind, int launcher_pid,
                    size_t count = 1) {
  auto started = Clock::now();
  while (Clock::now() - started < std::chrono::duration<double>(kGuardSeconds) &&
         process_alive(launcher_pid)) {
    if (events(run, kind).size() >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return events(run, kind).size() >= count;
}

// Brings a host back (bring_back) with worker 0 stopped (SIGSTOP) until there are `count` "grow"
// events, then lets it go on (SIGCONT): the group cannot train to its end before the host's
// joiners are warm and let in, however slowly they start on a busy machine. The others wait for
// worker 0 in their collectives; the freeze watch's floor is far above the wait
// (write_elastic_job). False when the guard passed or the launcher ended first.
template <typename BringBack>
bool grows_with_worker_0_held(const std::string& run, int launcher_pid, size_t count,
                              BringBack bring_back) {
  std::optional<common::ProgressSample> record =
      common::read_progress_record(run + "/progress/worker-0");
  REQUIRE(record);
  const pid_t worker_0 = static_cast<pid_t>(record->pid);
  REQUIRE(::kill(worker_0, SIGSTOP) == 0);
  bring_back();
  bool grew = wait_for_event(run, "grow", launcher_pid, count);
  ::kill(worker_0, SIGCONT);
  INFO(read_all(run + "/events.jsonl"));
  CHECK(grew);
  return grew;
}

// The ledger's lines, one per (epoch, step, shard) computed, kept once each: a step redone after
// a re-formation is computed again with the same examples (checked).
std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<int64_t>> ledger(
    const std::string& run) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<int64_t>> out;
  for (int w = 0; w < 4; ++w) {
    std::ifstream in(run + "/ledger/worker-" + std::to_string(w) + ".jsonl");
    for (std::string line; std::getline(in, line);) {
      common::JsonDocument d = common::JsonDocument::parse(line, "ledger");
      auto key = std::make_tuple(d.root().at("epoch").as_int(0, 1 << 20),
                                 d.root().at("step").as_int(0, 1 << 30),
                                 d.root().at("shard").as_int(0, 1 << 20));
      std::vector<int64_t> ids;
      for (const common::JsonNode& id : d.root().at("ids").as_array())
        ids.push_back(id.as_int(0, int64_t{1} << 40));
      auto [at, fresh] = out.emplace(key, ids);
      if (!fresh) REQUIRE(at->second == ids);  // the same examples each time
    }
  }
  return out;
}

// Writes the host list (text, replaced atomically) that the elastic job's discovery reads.
void offer_hosts(const std::string& host_list, const std::string& text) {
  std::ofstream(host_list + ".new") << text;
  std::rename((host_list + ".new").c_str(), host_list.c_str());
}

// calm_job made elastic (min_workers 2, hosts from `cat host_list`) with worker 0 sleeping in
// each step (the others wait for it: the math is the same), so the run lasts long enough for a
// shrink, and the freeze watch's floor at the guard, above any hold of worker 0
// (grows_with_worker_0_held); written to dir/elastic.json, whose path it returns.
std::string write_elastic_job(const TempDir& dir, const std::string& calm_job,
                              const std::string& host_list) {
  std::string elastic_job = dir.path() + "/elastic.json";
  std::string text = read_all(calm_job);
  text.replace(text.find(R"("env": {)"), 8,
               R"("elastic": {"min_workers": 2, "host_discovery": ["cat", ")" + host_list +
                   R"("], "discovery_interval_seconds": 0.5},
                   "freeze_seconds": )" +
                   std::to_string(static_cast<int>(kGuardSeconds)) + R"(,
                   "env": {"DTRAIN_TEST_SLOW_STEP_MS": "0:350", )");
  std::ofstream(elastic_job) << text;
  return elastic_job;
}

}  // namespace

TEST_CASE("elastic over ssh: a host cut off leaves the group, comes back, same model") {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string train = main_job_train(kEpochs, kSteps);
  train.insert(train.rfind('}'), R"(, "ledger": true)");
  std::string calm_job = write_job(dir, hosts, train);
  std::string calm = dir.path() + "/calm";
  std::string expected = undisturbed_model(dir, hosts, calm_job);

  std::string host_list = dir.path() + "/hosts";
  auto offer = [&](const std::string& text) { offer_hosts(host_list, text); };
  offer(hosts.host(0) + "\n" + hosts.host(1) + ":2\n");
  std::string elastic_job = write_elastic_job(dir, calm_job, host_list);
  ProcessOptions options;
  options.timeout_seconds = 240;
  std::string run = dir.path() + "/elastic";
  BackgroundProcess launcher(launch_argv(hosts, elastic_job, run), options);
  // Epoch 1: the list drops host 1, then names it again.
  REQUIRE(wait_for_step(run, 8, launcher.pid(), 120));
  offer("# host 1 is being taken away\n" + hosts.host(0) + "\n");
  REQUIRE(wait_for_event(run, "shrink", launcher.pid()));
  REQUIRE(wait_for_step(run, step_of_worker_0(run) + 2, launcher.pid(), kGuardSeconds));
  REQUIRE(grows_with_worker_0_held(run, launcher.pid(), 1,
                                   [&] { offer(hosts.host(0) + "\n" + hosts.host(1) + "\n"); }));
  // Epoch 2: host 1's link is cut, then restored.
  REQUIRE(wait_for_step(run, kSteps + 2, launcher.pid(), 120));
  const size_t at_cut = event_kinds(run).size();
  hosts.cut_link(1);
  REQUIRE(wait_for_event(run, "shrink", launcher.pid(), 2));
  int64_t at_shrink = step_of_worker_0(run);
  // Host 0 trains on alone, and only then does the link come back.
  REQUIRE(wait_for_step(run, at_shrink + 2, launcher.pid(), kGuardSeconds));
  const size_t at_restore = event_kinds(run).size();
  CHECK(grows_with_worker_0_held(run, launcher.pid(), 2, [&] { hosts.restore_link(1); }));
  auto r = launcher.wait(240);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);

  std::vector<common::JsonDocument> shrink = events(run, "shrink");
  REQUIRE(shrink.size() == 2);
  CHECK(shrink[0].root().at("why").as_string() == "not in elastic.host_discovery's list");
  for (const common::JsonDocument& e : shrink) {
    CHECK(e.root().at("world_size").as_int(0, 99) == 2);
    CHECK(e.root().at("host").as_string() == hosts.host(1));
  }
  std::vector<common::JsonDocument> grow = events(run, "grow");
  REQUIRE(grow.size() == 2);
  for (const common::JsonDocument& e : grow) CHECK(e.root().at("world_size").as_int(0, 99) == 4);
  // In this order: the first shrink and grow before the cut, the second shrink after the cut
  // and before the link came back, the second grow after that.
  std::vector<size_t> shrink_at = event_indexes(run, "shrink"),
                      grow_at = event_indexes(run, "grow");
  CHECK(shrink_at[0] < grow_at[0]);
  CHECK(grow_at[0] < at_cut);
  CHECK(shrink_at[1] >= at_cut);
  CHECK(shrink_at[1] < at_restore);
  CHECK(grow_at[1] >= at_restore);
  CHECK(events(run, "restart").empty());
  CHECK(read_all(run + "/model/model.safetensors") == expected);

  // The ledger: every (epoch, step, shard) computed, and in each epoch no example twice, as in the
  // undisturbed run.
  auto used = ledger(run);
  CHECK(used == ledger(calm));
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    std::multiset<int64_t> seen;
    for (int step = 0; step < kSteps; ++step) {
      for (int shard = 0; shard < 4; ++shard) {
        auto at = used.find({epoch, step, shard});
        REQUIRE(at != used.end());
        CHECK(at->second.size() == static_cast<size_t>(kBatch));
        seen.insert(at->second.begin(), at->second.end());
      }
    }
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == seen.size());
  }
  {
    common::JsonDocument state =
        common::JsonDocument::parse(read_all(run + "/state.json"), "state.json");
    CHECK(state.root().at("world_size").as_int(0, 99) == 4);
    CHECK(state.root().at("membership").as_array().size() == 4);
  }
  CHECK(processes_of_run(run).empty());
}

namespace {

// The job `train` (two epochs of kShrinkGrowSteps steps) on two hosts of two workers, elastic:
// in epoch 1 host 1 leaves, so host 0's two workers hold all four shards (batch statistics,
// flips and text windows included) across the epoch's end; in epoch 2 host 1 comes back. The
// final model is the undisturbed run's.
constexpr int kShrinkGrowSteps = 24;
void shrink_and_grow(const std::string& train) {
  NetnsHosts hosts(2);
  SKIP_UNLESS_AVAILABLE(hosts);
  TempDir dir;
  std::string calm_job = write_job(dir, hosts, train);
  std::string expected = undisturbed_model(dir, hosts, calm_job);

  std::string host_list = dir.path() + "/hosts";
  auto offer = [&](const std::string& text) { offer_hosts(host_list, text); };
  offer(hosts.host(0) + "\n" + hosts.host(1) + "\n");
  std::string elastic_job = write_elastic_job(dir, calm_job, host_list);
  ProcessOptions options;
  options.timeout_seconds = 240;
  std::string run = dir.path() + "/elastic";
  BackgroundProcess launcher(launch_argv(hosts, elastic_job, run), options);
  REQUIRE(wait_for_step(run, 6, launcher.pid(), 120));
  offer(hosts.host(0) + "\n");
  REQUIRE(wait_for_event(run, "shrink", launcher.pid()));
  REQUIRE(wait_for_step(run, kShrinkGrowSteps + 2, launcher.pid(), kGuardSeconds));
  REQUIRE(grows_with_worker_0_held(run, launcher.pid(), 1,
                                   [&] { offer(hosts.host(0) + "\n" + hosts.host(1) + "\n"); }));
  auto r = launcher.wait(240);
  INFO(r.out << r.err);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(events(run, "shrink").size() == 1);
  CHECK(events(run, "grow").size() == 1);
  CHECK(events(run, "restart").empty());
  // The weights and any moving statistics (both in the final model) are the undisturbed run's.
  CHECK(read_all(run + "/model/model.safetensors") == expected);
  CHECK(processes_of_run(run).empty());
}

}  // namespace

TEST_CASE("elastic over ssh: a ResNet with batch normalization shrinks and grows, same model") {
  shrink_and_grow(resnet_job_train(2, kShrinkGrowSteps));
}

TEST_CASE("elastic over ssh: a character GPT on text shrinks and grows, same model") {
  shrink_and_grow(with_language_model(resnet_job_train(2, kShrinkGrowSteps)));
}
