// group_view's straggler rule on hand-made snapshots: the task computing over 1.5x the median of
// the others (and 1 ms over it) is named in state.json and Prometheus; equal peers, one task
// reporting, or tasks that do not report compute time name nobody. Also the generation and the
// recoveries in place (docs/design.md#in-place-recovery) in both.
#include <catch2/catch.hpp>

#include "common/json.h"
#include "launcher/view/group_view.h"

using namespace dtrain;
using launcher::TaskSnapshot;

namespace {

// A running task whose last progress reports compute and wait seconds per step (< 0: absent).
TaskSnapshot task(const std::string& name, double compute, double wait, int64_t step = 100) {
  TaskSnapshot t;
  t.task = name;
  t.pid = 100;
  t.state = "running";
  common::ControlMessage p;
  p.type = common::ControlMessageType::kProgress;
  p.task = name;
  p.samples_per_second = 640;  // the group's pace, the same for every worker
  if (compute >= 0) p.compute_seconds_per_step = compute;
  if (wait >= 0) p.wait_seconds_per_step = wait;
  p.global_step = step;
  t.progress = p;
  return t;
}

launcher::GroupSnapshot group(std::vector<TaskSnapshot> tasks) {
  launcher::GroupSnapshot g;
  g.job = "tiny";
  g.status = "running";
  g.tasks = std::move(tasks);
  return g;
}

}  // namespace

TEST_CASE("the straggler computes longest, over 1.5x the median of the others") {
  auto g = group({task("worker:0", 0.010, 0.041), task("worker:1", 0.052, 0.001),
                  task("worker:2", 0.011, 0.040), task("worker:3", 0.009, 0.042)});
  std::optional<launcher::Straggler> s = launcher::find_straggler(g.tasks);
  REQUIRE(s);
  CHECK(s->task == "worker:1");
  CHECK(s->compute_seconds_per_step == 0.052);
  CHECK(s->others_median_seconds == 0.010);
  g.straggler = s;  // the supervisor's StragglerWatch's verdict

  common::JsonDocument doc = common::JsonDocument::parse(launcher::state_json(g), "state");
  CHECK(doc.root().at("straggler").at("task").as_string() == "worker:1");
  CHECK(doc.root().at("straggler").at("others_median_seconds").as_number(0, 1) == 0.010);
  const common::JsonNode& p1 = doc.root().at("workers").as_array()[1].at("last_progress");
  CHECK(p1.at("compute_seconds_per_step").as_number(0, 1) == 0.052);
  CHECK(p1.at("wait_seconds_per_step").as_number(0, 1) == 0.001);

  std::string text = launcher::prometheus_text(g);
  CHECK(text.find("dtrain_worker_compute_seconds_per_step{job=\"tiny\",task=\"worker:1\"} 0.052") !=
        std::string::npos);
  CHECK(text.find("dtrain_worker_allreduce_wait_seconds_per_step{job=\"tiny\",task=\"worker:0\"} "
                  "0.041") != std::string::npos);
  CHECK(text.find("dtrain_worker_straggler{job=\"tiny\",task=\"worker:1\"} 1") !=
        std::string::npos);
  CHECK(text.find("dtrain_worker_straggler{job=\"tiny\",task=\"worker:0\"} 0") !=
        std::string::npos);
}

TEST_CASE("two workers: the slower is the straggler only past the ratio and the 1 ms floor") {
  auto named = [](double a, double b) {
    auto s =
        launcher::find_straggler(group({task("worker:0", a, 0), task("worker:1", b, 0)}).tasks);
    return s ? s->task : std::string("nobody");
  };
  CHECK(named(0.050, 0.010) == "worker:0");
  CHECK(named(0.010, 0.016) == "worker:1");  // 1.6x and 6 ms over
  CHECK(named(0.010, 0.014) == "nobody");    // 1.4x: within the ratio
  CHECK(named(0.010, 0.010) == "nobody");    // equal peers
  CHECK(named(0.0002, 0.0009) == "nobody");  // 4.5x, but under 1 ms over: noise
  CHECK(named(0.0, 0.002) == "worker:1");    // a zero median: any excess past the floor
}

TEST_CASE("nobody is named without two tasks reporting compute time") {
  auto one = group({task("worker:0", 0.050, 0.0), task("worker:1", -1, -1)});
  CHECK_FALSE(launcher::find_straggler(one.tasks));
  TaskSnapshot silent;  // not started: no progress at all
  silent.task = "worker:2";
  one.tasks.push_back(silent);
  CHECK_FALSE(launcher::find_straggler(one.tasks));
  std::string json = launcher::state_json(one);
  CHECK(json.find("straggler") == std::string::npos);
  CHECK(json.find("wait_seconds_per_step") != std::string::npos);  // worker:0 sent 0
  std::string text = launcher::prometheus_text(one);
  CHECK(text.find("dtrain_worker_straggler{job=\"tiny\",task=\"worker:0\"} 0") !=
        std::string::npos);
  CHECK(text.find("task=\"worker:1\"} 0") == std::string::npos);  // no compute: no gauges
}

TEST_CASE("state.json and Prometheus carry the generation and the recoveries in place") {
  auto g = group({task("worker:0", -1, -1)});
  g.attempt = 1;
  g.generation = 2;
  g.in_place_recoveries = 3;
  std::string json = launcher::state_json(g);
  CHECK(json.find(R"("attempt":1,"generation":2,)") != std::string::npos);
  CHECK(json.find(R"("in_place_recoveries":3,)") != std::string::npos);
  std::string text = launcher::prometheus_text(g);
  CHECK(text.find("dtrain_generation{job=\"tiny\"} 2\n") != std::string::npos);
  CHECK(text.find("dtrain_in_place_recoveries_total{job=\"tiny\"} 3\n") != std::string::npos);
}

// Elastic membership (docs/design.md#elastic-membership): the world size now and its history.
TEST_CASE("state.json and Prometheus carry an elastic group's world size; others have none") {
  auto g = group({task("worker:0", -1, -1), task("worker:1", -1, -1)});
  std::string plain = launcher::state_json(g);
  CHECK(plain.find("world_size") == std::string::npos);
  CHECK(plain.find("membership") == std::string::npos);
  CHECK(launcher::prometheus_text(g).find("dtrain_world_size") == std::string::npos);

  g.world_size = 3;
  g.membership = {{"2026-11-26T04:00:00.000Z", 1, 2}, {"2026-11-26T04:00:05.000Z", 2, 3}};
  std::string json = launcher::state_json(g);
  common::JsonDocument doc = common::JsonDocument::parse(json, "state.json");
  CHECK(doc.root().at("world_size").as_int(0, 99) == 3);
  auto points = doc.root().at("membership").as_array();
  REQUIRE(points.size() == 2);
  CHECK(points[0].at("at").as_string() == "2026-11-26T04:00:00.000Z");
  CHECK(points[0].at("generation").as_int(0, 99) == 1);
  CHECK(points[0].at("world_size").as_int(0, 99) == 2);
  CHECK(points[1].at("generation").as_int(0, 99) == 2);
  CHECK(points[1].at("world_size").as_int(0, 99) == 3);
  CHECK(doc.root().at("workers").as_array().size() == 2);
  std::string text = launcher::prometheus_text(g);
  CHECK(text.find("# TYPE dtrain_world_size gauge\n") != std::string::npos);
  CHECK(text.find("dtrain_world_size{job=\"tiny\"} 3\n") != std::string::npos);

  g.membership.clear();  // elastic, never resized: the size, an empty history
  doc = common::JsonDocument::parse(launcher::state_json(g), "state.json");
  CHECK(doc.root().at("membership").as_array().empty());
}

TEST_CASE("a straggler is named only when the same task is the slowest in 3 windows in a row") {
  launcher::StragglerWatch watch;
  auto look = [&](double a, double b, int64_t step) {
    auto s = watch.look(group({task("worker:0", a, 0, step), task("worker:1", b, 0, step)}).tasks);
    return s ? s->task : std::string("nobody");
  };
  // A noisy moment between identical workers (1.9x once, issue 46): nobody.
  CHECK(look(0.010, 0.019, 10) == "nobody");
  CHECK(look(0.010, 0.010, 20) == "nobody");
  // The same report seen again is one window, not two.
  CHECK(look(0.010, 0.030, 30) == "nobody");
  CHECK(look(0.010, 0.030, 30) == "nobody");
  CHECK(look(0.010, 0.030, 30) == "nobody");
  CHECK(look(0.010, 0.031, 40) == "nobody");
  CHECK(look(0.010, 0.032, 50) == "worker:1");  // the third window in a row
  CHECK(look(0.010, 0.033, 60) == "worker:1");
  // Another task slowest: it starts over.
  CHECK(look(0.040, 0.010, 70) == "nobody");
  CHECK(look(0.040, 0.010, 80) == "nobody");
  CHECK(look(0.040, 0.010, 90) == "worker:0");
  // A window within the ratio ends the verdict.
  CHECK(look(0.010, 0.011, 100) == "nobody");
}
