// dtrain-worker's flags: --progress-interval takes seconds (5 by default, 0 for one line per
// epoch) and refuses what is not a number of seconds >= 0.
#include <catch2/catch.hpp>

#include "common/errors.h"
#include "worker/worker_options.h"

using dtrain::train::parse_worker_options;

TEST_CASE("--progress-interval: 5 s by default, any seconds >= 0, nothing else") {
  CHECK(parse_worker_options({"--config", "job.json"}).progress_line_seconds == 5.0);
  CHECK(parse_worker_options({"--progress-interval", "0.5"}).progress_line_seconds == 0.5);
  CHECK(parse_worker_options({"--progress-interval", "0"}).progress_line_seconds == 0.0);
  CHECK_THROWS_AS(parse_worker_options({"--progress-interval", "-1"}), dtrain::common::ConfigError);
  CHECK_THROWS_AS(parse_worker_options({"--progress-interval", "soon"}),
                  dtrain::common::ConfigError);
  CHECK_THROWS_AS(parse_worker_options({"--progress-interval", "nan"}),
                  dtrain::common::ConfigError);
  CHECK(dtrain::train::worker_usage().find("--progress-interval") != std::string::npos);
}
