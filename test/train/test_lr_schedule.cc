// Learning-rate schedules: Keras's CosineDecay (with warm-up) and ExponentialDecay against values
// worked out by hand from Keras's formulas, the run-long default decay, scaling by workers, the
// optimizer taking the rate step by step, and parse errors naming the JSON path.
#include <catch2/catch.hpp>
#include <cmath>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/backend.h"
#include "worker/spec/lr_schedule.h"
#include "worker/train/optimizer.h"

using namespace dtrain;
using Catch::Matchers::Contains;

namespace {

train::LearningRateSchedule parse(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "lr");
  return train::parse_learning_rate(doc.root());
}

train::OptimizerSpec parse_optimizer(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "opt");
  return train::parse_optimizer_spec(doc.root());
}

}  // namespace

TEST_CASE("a number is a constant rate") {
  train::LearningRateSchedule s = parse("0.05");
  s.resolve(1000, 4);
  CHECK(s.constant());
  CHECK(s.rate(0) == 0.05);
  CHECK(s.rate(999) == 0.05);
}

TEST_CASE("cosine_decay follows Keras's CosineDecay") {
  train::LearningRateSchedule s =
      parse(R"({"type": "cosine_decay", "initial_learning_rate": 0.1, "decay_steps": 10})");
  s.resolve(1000, 1);
  CHECK_FALSE(s.constant());
  CHECK(s.rate(0) == Approx(0.1));
  CHECK(s.rate(2) == Approx(0.0904508497));  // 0.1 * 0.5 * (1 + cos(0.2 pi))
  CHECK(s.rate(5) == Approx(0.05));
  CHECK(s.rate(10) == Approx(0.0).margin(1e-12));
  CHECK(s.rate(50) == Approx(0.0).margin(1e-12));  // stays at the floor after decay_steps

  train::LearningRateSchedule floor = parse(
      R"({"type": "cosine_decay", "initial_learning_rate": 0.1, "decay_steps": 10, "alpha": 0.2})");
  floor.resolve(1000, 1);
  CHECK(floor.rate(5) == Approx(0.1 * (0.8 * 0.5 + 0.2)));
  CHECK(floor.rate(10) == Approx(0.02));
}

TEST_CASE("cosine_decay warms up linearly to warmup_target, then decays from it") {
  train::LearningRateSchedule s = parse(R"({"type": "cosine_decay", "initial_learning_rate": 0.0,
      "warmup_steps": 4, "warmup_target": 0.1, "decay_steps": 10})");
  s.resolve(1000, 1);
  CHECK(s.rate(0) == 0.0);
  CHECK(s.rate(2) == Approx(0.05));
  CHECK(s.rate(4) == Approx(0.1));
  CHECK(s.rate(9) == Approx(0.05));  // 5 of 10 decay steps after the warm-up
  CHECK(s.rate(14) == Approx(0.0).margin(1e-12));
}

TEST_CASE("exponential_decay, smooth and staircase") {
  train::LearningRateSchedule s = parse(R"({"type": "exponential_decay",
      "initial_learning_rate": 0.1, "decay_steps": 2, "decay_rate": 0.5})");
  s.resolve(1000, 1);
  CHECK(s.rate(3) == Approx(0.1 * std::pow(0.5, 1.5)));
  train::LearningRateSchedule stairs = parse(R"({"type": "exponential_decay",
      "initial_learning_rate": 0.1, "decay_steps": 2, "decay_rate": 0.5, "staircase": true})");
  stairs.resolve(1000, 1);
  CHECK(stairs.rate(3) == Approx(0.05));
  CHECK(stairs.rate(4) == Approx(0.025));
}

TEST_CASE("decay_steps left out spans the whole run; scaling multiplies every rate by workers") {
  train::LearningRateSchedule s =
      parse(R"({"type": "cosine_decay", "initial_learning_rate": 0.01, "warmup_steps": 100,
                "warmup_target": 0.02})");
  s.scale_by_workers = true;
  s.resolve(1100, 4);
  CHECK(s.decay_steps == 1000);
  CHECK(s.rate(0) == Approx(0.04));
  CHECK(s.rate(100) == Approx(0.08));
  CHECK(s.rate(600) == Approx(0.04));
  CHECK(s.rate(1100) == Approx(0.0).margin(1e-12));
}

TEST_CASE("the optimizer takes the schedule's rate step by step and says when it changes") {
  train::OptimizerSpec constant = parse_optimizer(
      R"({"type": "sgd", "learning_rate": 0.01, "momentum": 0.9, "scale_learning_rate": true})");
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  train::Optimizer scaled(constant, 8, backend->device(), 100, 2);
  CHECK(scaled.same_every_step());
  CHECK(scaled.learning_rate() == Approx(0.02));

  train::OptimizerSpec cosine = parse_optimizer(R"({"type": "sgd", "momentum": 0.9,
      "learning_rate": {"type": "cosine_decay", "initial_learning_rate": 0.1}})");
  train::Optimizer decaying(cosine, 8, backend->device(), 10, 1);
  CHECK_FALSE(decaying.same_every_step());  // a recorded CUDA graph would replay one rate
  CHECK(decaying.learning_rate() == Approx(0.1));
  for (int i = 0; i < 5; ++i) decaying.begin_step();
  CHECK(decaying.learning_rate() == Approx(0.05));  // the rate of step 5, the next one
  decaying.set_iterations(2);                       // a restored checkpoint
  CHECK(decaying.learning_rate() == Approx(0.0904508497));
}

TEST_CASE("schedule mistakes are ConfigErrors naming the JSON path") {
  auto error_of = [](const std::string& json) {
    try {
      parse_optimizer(json);
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of(R"({"type": "sgd", "learning_rate": {"type": "linear"}})"),
             Contains("learning_rate.type") && Contains("cosine_decay or exponential_decay"));
  CHECK_THAT(error_of(R"({"type": "sgd", "learning_rate": {"type": "cosine_decay"}})"),
             Contains("initial_learning_rate"));
  CHECK_THAT(error_of(R"({"type": "sgd", "learning_rate": {"type": "cosine_decay",
                 "initial_learning_rate": 0.1, "decay_rate": 0.5}})"),
             Contains("decay_rate"));
  CHECK_THAT(error_of(R"({"type": "sgd", "learning_rate": -1})"), Contains("learning_rate"));
  CHECK_THAT(error_of(R"({"type": "sgd", "learning_rate": {"type": "cosine_decay",
                 "initial_learning_rate": 0.1, "warmup_steps": 5}})"),
             Contains("warmup_steps") && Contains("warmup_target"));
  CHECK_THAT(error_of(R"({"type": "adam", "scale_learning_rate": 1})"),
             Contains("scale_learning_rate"));
  CHECK_THAT(error_of(R"({"type": "sgd", "learning_rate": {"type": "exponential_decay",
                 "initial_learning_rate": 0.1, "decay_steps": 0, "decay_rate": 0.5}})"),
             Contains("decay_steps"));
}
